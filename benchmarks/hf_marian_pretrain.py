"""A stand-in for a downloaded OPUS-MT model: a small MarianMT trained with Hugging Face's own
code (transformers + torch, CPU) on half A of Multi30k English->German, saved as the hub
serves a MarianMT directory.

  python benchmarks/hf_marian_pretrain.py --data_out /tmp/m30k_halves \
      --out /tmp/marian_m30k_a --minutes 30 --eval 1000
  python benchmarks/hf_marian_pretrain.py --data_out /tmp/h --out /tmp/m --steps 20 \
      --d_model 64 --eval 16                             # smoke test, ~1 min on 2 cores

Writes:
  --data_out: train_a.{en,de} (train lines 0..14499), train_b.{en,de} (14500..28999),
    validation.{en,de} and test2016.{en,de} (copies), for the `folder` dataset ({split}.{lang}).
  --out: source.spm and target.spm (SentencePiece unigram models of half A's English and
    German), vocab.json (OPUS-MT's joint vocabulary: </s> 0, <unk> 1, the pieces of both
    models, <pad> last), tokenizer_config.json, config.json, model.safetensors,
    generation_config.json (OPUS-MT's) and training_log.json (steps, minutes, final loss and,
    with --eval N, sacreBLEU on the first N test2016 sentences).

Training: AdamW (betas 0.9/0.98), linear warm-up then inverse-sqrt decay, label smoothing 0.1,
batches grouped by length of at most --max_tokens padded tokens (rows x longest side), until
--minutes of wall time or --steps steps, whichever comes first; a progress line every 50 steps.
The data (non-commercial research licence) is read from --data; never copy it into the repo.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import time

import sentencepiece as spm
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer
from transformers.models.marian.modeling_marian import shift_tokens_right

HALF = 14500  # half A is train lines [0, HALF), half B [HALF, 2 * HALF)


def read_lines(path: str) -> list[str]:
    with open(path, encoding='utf-8') as f:
        return f.read().splitlines()


def write_lines(path: str, lines: list[str]) -> None:
    with open(path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')


def write_json(path: str, obj) -> None:
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)


def write_halves(data: str, out: str) -> dict[str, dict[str, list[str]]]:
    """Writes the folder dataset's files into ``out``; returns {split: {lang: lines}}."""
    os.makedirs(out, exist_ok=True)
    splits = {}
    for lang in ('en', 'de'):
        train = read_lines(os.path.join(data, f'train.{lang}'))
        assert len(train) == 2 * HALF, f'train.{lang} has {len(train)} lines, not {2 * HALF}'
        parts = {'train_a': train[:HALF], 'train_b': train[HALF:]}
        parts['validation'] = read_lines(os.path.join(data, f'val.{lang}'))
        parts['test2016'] = read_lines(os.path.join(data, f'test2016.{lang}'))
        for split, lines in parts.items():
            write_lines(os.path.join(out, f'{split}.{lang}'), lines)
            splits.setdefault(split, {})[lang] = lines
    return splits


def train_spm(lines: list[str], vocab_size: int) -> spm.SentencePieceProcessor:
    """A unigram model of up to ``vocab_size`` pieces (half A's English supports ~5.5k)."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type='unigram',
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=2,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def write_tokenizer(src: list[str], tgt: list[str], out: str, vocab_size: int) -> MarianTokenizer:
    """source.spm, target.spm, vocab.json and tokenizer_config.json as OPUS-MT's."""
    os.makedirs(out, exist_ok=True)
    vocab = {'</s>': 0, '<unk>': 1}
    for name, lines in (('source.spm', src), ('target.spm', tgt)):
        model = train_spm(lines, vocab_size)
        with open(os.path.join(out, name), 'wb') as f:
            f.write(model.serialized_model_proto())
        for i in range(model.get_piece_size()):
            if not (model.is_control(i) or model.is_unknown(i)):
                vocab.setdefault(model.id_to_piece(i), len(vocab))
    vocab['<pad>'] = len(vocab)
    config = {'source_lang': 'en', 'target_lang': 'de', 'separate_vocabs': False}
    config |= {'model_max_length': 512, 'tokenizer_class': 'MarianTokenizer'}
    write_json(os.path.join(out, 'vocab.json'), vocab)
    write_json(os.path.join(out, 'tokenizer_config.json'), config)
    tok = MarianTokenizer.from_pretrained(out)
    assert (tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (0, 1, len(vocab) - 1)
    return tok


def make_batches(pairs: list[tuple[list[int], list[int]]], max_tokens: int, seed: int):
    """Index lists sorted by (target, source) length, each under ~max_tokens padded tokens."""
    rng = random.Random(seed)
    order = sorted(
        range(len(pairs)), key=lambda i: (len(pairs[i][1]), len(pairs[i][0]), rng.random())
    )
    batches, batch, longest = [], [], 0
    for i in order:
        longest_next = max(longest, len(pairs[i][0]), len(pairs[i][1]))
        if batch and longest_next * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest_next = [], max(len(pairs[i][0]), len(pairs[i][1]))
        batch.append(i)
        longest = longest_next
    return batches + [batch]


def collate(pairs, batch: list[int], pad: int, start: int):
    """(model inputs, labels): sources padded with <pad>, labels with -100."""

    def padded(seqs, value):
        width = max(len(s) for s in seqs)
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs])

    input_ids = padded([pairs[i][0] for i in batch], pad)
    labels = padded([pairs[i][1] for i in batch], -100)
    inputs = {'input_ids': input_ids, 'attention_mask': (input_ids != pad).long()}
    return inputs | {'decoder_input_ids': shift_tokens_right(labels, pad, start)}, labels


def train(model: MarianMTModel, pairs, args) -> dict:
    cfg, warmup = model.config, args.warmup
    batches = make_batches(pairs, args.max_tokens, args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, math.sqrt(warmup / (s + 1)))
    )
    print(f'{len(pairs)} pairs, {len(batches)} batches an epoch', flush=True)
    model.train()
    rng, step, epoch, losses, tokens = random.Random(args.seed), 0, 0, [], 0
    start = window = time.time()
    deadline, window_tokens = start + 60 * args.minutes, 0
    while step < args.steps and time.time() < deadline:
        rng.shuffle(batches)
        for batch in batches:
            inputs, labels = collate(pairs, batch, cfg.pad_token_id, cfg.decoder_start_token_id)
            logits = model(**inputs).logits
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels.reshape(-1),
                label_smoothing=args.label_smoothing,
                ignore_index=-100,
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step, tokens = step + 1, tokens + int((labels != -100).sum())
            losses.append(loss.item())
            if step % 50 == 0:
                now = time.time()
                print(
                    f'step {step}  epoch {epoch}  loss {sum(losses[-50:]) / 50:.3f}  '
                    f'lr {sched.get_last_lr()[0]:.2e}  '
                    f'{(tokens - window_tokens) / (now - window):.0f} tgt tok/s  '
                    f'{(now - start) / step:.2f} s/step  elapsed {(now - start) / 60:.1f} min',
                    flush=True,
                )
                window, window_tokens = now, tokens
            if step >= args.steps or time.time() >= deadline:
                break
        epoch += 1
    minutes, final = (time.time() - start) / 60, sum(losses[-50:]) / len(losses[-50:])
    print(f'trained {step} steps in {minutes:.1f} min, final loss {final:.3f}', flush=True)
    return {'steps': step, 'minutes': round(minutes, 2), 'final_loss': round(final, 4)}


@torch.no_grad()
def evaluate(model, tok, src: list[str], ref: list[str], batch_size: int = 32) -> float:
    import sacrebleu

    model.eval()
    hyps = [''] * len(src)
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    for k in range(0, len(order), batch_size):
        idx = order[k : k + batch_size]
        enc = tok([src[i] for i in idx], return_tensors='pt', padding=True)
        out = model.generate(**enc, num_beams=4, max_new_tokens=2 * enc['input_ids'].shape[1] + 10)
        texts = tok.batch_decode(out, skip_special_tokens=True, use_source_tokenizer=False)
        for i, text in zip(idx, texts, strict=True):
            hyps[i] = text
    for i in range(3):
        print(f'  src: {src[i]}\n  hyp: {hyps[i]}\n  ref: {ref[i]}', flush=True)
    bleu = sacrebleu.corpus_bleu(hyps, [ref])
    print(f'test2016 (first {len(src)}): {bleu}', flush=True)
    return bleu.score


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--data', default='/work/shared/data/multi30k')
    p.add_argument('--data_out', required=True, help='the folder dataset of the two halves')
    p.add_argument('--out', required=True, help='the MarianMT directory written')
    p.add_argument('--vocab_size', type=int, default=8000, help='per SentencePiece model')
    p.add_argument('--d_model', type=int, default=256)
    p.add_argument('--layers', type=int, default=3, help='encoder and decoder layers each')
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--d_ff', type=int, default=1024)
    p.add_argument('--dropout', type=float, default=0.1)
    p.add_argument('--lr', type=float, default=5e-4)
    p.add_argument('--warmup', type=int, default=500)
    p.add_argument('--label_smoothing', type=float, default=0.1)
    p.add_argument('--max_tokens', type=int, default=3000, help='rows x longest side, a batch')
    p.add_argument('--minutes', type=float, default=30.0, help='training wall time at most')
    p.add_argument('--steps', type=int, default=10**9, help='training steps at most')
    p.add_argument('--eval', type=int, default=0, help='BLEU on the first N test2016 lines')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    splits = write_halves(args.data, args.data_out)
    half_a = splits['train_a']
    tok = write_tokenizer(half_a['en'], half_a['de'], args.out, args.vocab_size)
    v = len(tok)
    print(f'wrote {args.data_out}; joint vocabulary {v} pieces', flush=True)
    enc = tok(half_a['en'], text_target=half_a['de'])
    pairs = list(zip(enc['input_ids'], enc['labels'], strict=True))

    config = MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=args.d_model,
        encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function='swish',
        dropout=args.dropout, attention_dropout=0.0, activation_dropout=0.0,
        max_position_embeddings=512, scale_embedding=True, pad_token_id=v - 1,
        eos_token_id=0, decoder_start_token_id=v - 1, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # fmt: skip
    model = MarianMTModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f'MarianMTModel: {n_params / 1e6:.1f}M parameters', flush=True)
    log = train(model, pairs, args) | {'vocab_size': v, 'parameters': n_params}
    log['args'] = vars(args)

    model.generation_config = GenerationConfig(
        num_beams=4, length_penalty=1.0, max_length=512, bad_words_ids=[[v - 1]],
        decoder_start_token_id=v - 1, pad_token_id=v - 1, eos_token_id=0, forced_eos_token_id=0,
    )  # fmt: skip
    model.save_pretrained(args.out)
    write_json(os.path.join(args.out, 'training_log.json'), log)
    print(f'saved {args.out}: {sorted(os.listdir(args.out))}', flush=True)
    if args.eval:
        test = {lang: lines[: args.eval] for lang, lines in splits['test2016'].items()}
        log['test2016_bleu'] = evaluate(model, tok, test['en'], test['de'])
        log['eval_sentences'] = len(test['en'])
        write_json(os.path.join(args.out, 'training_log.json'), log)


if __name__ == '__main__':
    main()
