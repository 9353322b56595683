"""Fine-tuning an M2M100 end to end, with a stand-in for a downloaded one: a small M2M100 trained
by Hugging Face's own code on half A of Multi30k in both directions, converted, evaluated,
fine-tuned on half B English->German, evaluated again, beside the same steps from scratch.

    python benchmarks/fairseq_finetune.py --work /tmp/fairseq_finetune \
        --out benchmarks/results/fairseq_finetune.json

1. The stand-in (WORK/hf): a SentencePiece BPE model of half A's English and German
   (`sentencepiece.bpe.model`), fairseq's dictionary of its pieces (`vocab.json`: `<s>`,
   `<pad>`, `</s>`, `<unk>`, the pieces), M2M100's 100 codes (`__en__`, `__de__`, ...) listed in
   tokenizer_config.json as the hub's files list them; an `M2M100ForConditionalGeneration`
   (--layers + --layers, --d_model, FFN 4 x d_model, ReLU, scale_embedding) trained with
   benchmarks/hf_marian_pretrain.py's torch loop (AdamW, warm-up then inverse square root,
   label smoothing 0.1, batches of --max_tokens) for --pretrain_steps on half A both ways, each
   pair laid out by `M2M100Tokenizer` (`__en__ X </s>` -> `__de__ Y </s>`, and back), saved
   with `save_pretrained`; its `generate(num_beams=4, forced_bos_token_id=__de__)` scored too.
2. `transformer.convert` of it; `evaluate --source --reference --source_lang en
   --target_lang de` on test2016 (sacreBLEU and chrF++).
3. `train.py --config configs/multi30k.py:finetune` from it (`train.init_from`,
   `data.source_lang_code=en`, `data.target_lang_code=de`) on half B for --steps; evaluated.
4. The same model shape from scratch (`configs/multi30k.py`'s schedule, its own vocabulary, no
   codes) on half B for the same --steps; evaluated.

WORK/data holds the folder dataset: train_a and train_b (the halves of train's first
--train_lines), validation and test2016 (the first --sentences of val and test2016). One JSON
(--out): the four scores and every command. Figures: benchmarks/README.md. The data
(non-commercial research licence) stays in --data.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.measured import read, write  # noqa: E402 (after the path above)

DATA = REPO.parent / 'shared' / 'data' / 'multi30k'
SPM_FILE = 'sentencepiece.bpe.model'
# What the run from scratch copies of the converted run's model section: its shape and options.
SCRATCH_KEYS = (
    'd_model', 'num_heads', 'd_ff', 'num_encoder_layers', 'num_decoder_layers', 'ffn',
    'attention_bias', 'logits_bias', 'norm', 'pre_layer_norm', 'layer_norm_epsilon',
    'positions', 'scale_embedding', 'layernorm_embedding', 'share_embeddings', 'dropout_rate',
    'attention_dropout_rate', 'relu_dropout_rate',
)  # fmt: skip


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data', default=str(DATA), help='train, val, test2016 .{en,de}')
    parser.add_argument('--work', default='/tmp/fairseq_finetune', help='must be new or empty')
    parser.add_argument('--train_lines', type=int, default=0, help='of train (0: all), halved')
    parser.add_argument('--sentences', type=int, default=0, help='of test2016 (0: all)')
    parser.add_argument('--spm_pieces', type=int, default=8000)
    parser.add_argument('--d_model', type=int, default=128, help='FFN: 4 x d_model')
    parser.add_argument('--layers', type=int, default=2, help='encoder layers = decoder layers')
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--pretrain_steps', type=int, default=1500, help="Hugging Face's loop")
    parser.add_argument('--lr', type=float, default=1e-3, help="Hugging Face's loop's peak")
    parser.add_argument('--warmup', type=int, default=150)
    parser.add_argument('--max_tokens', type=int, default=3000, help='rows x longest side')
    parser.add_argument('--steps', type=int, default=1000, help='fine-tuning = from scratch')
    parser.add_argument('--beam_size', type=int, default=4)
    parser.add_argument(
        '--set', action='append', default=[], metavar='KEY=VALUE',
        help='a config override of both training runs (e.g. train.batch_size=8)',
    )  # fmt: skip
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/fairseq_finetune.json'))
    return parser.parse_args(argv)


def write_folder(data: str, out: pathlib.Path, train_lines: int, sentences: int) -> dict:
    """The folder dataset ({split}.{lang}: train_a, train_b, validation, test2016) in ``out``;
    its lines by split and language."""
    out.mkdir(parents=True)
    splits = {}
    for lang in ('en', 'de'):
        train = read(f'{data}/train.{lang}')[: train_lines or None]
        half = len(train) // 2
        test = read(f'{data}/test2016.{lang}')[: sentences or None]
        parts = {'train_a': train[:half], 'train_b': train[half : 2 * half], 'test2016': test}
        parts['validation'] = read(f'{data}/val.{lang}')[: sentences or None]
        for split, lines in parts.items():
            write(out / f'{split}.{lang}', lines)
            splits.setdefault(split, {})[lang] = lines
    return splits


def write_tokenizer(directory: pathlib.Path, texts: list[str], pieces: int):
    """M2M100's tokenizer files of a BPE model of ``texts`` in ``directory``; the tokenizer."""
    import io

    import sentencepiece as spm
    import transformers
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=pieces, model_type='bpe',
        character_coverage=1.0, hard_vocab_limit=False, num_threads=2, minloglevel=2,
    )  # fmt: skip
    (directory / SPM_FILE).write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = ['<s>', '<pad>', '</s>', '<unk>', *(sp.id_to_piece(i) for i in range(3, len(sp)))]
    (directory / 'vocab.json').write_text(
        json.dumps({p: i for i, p in enumerate(vocab)}, ensure_ascii=False), encoding='utf-8'
    )
    codes = [f'__{code}__' for code in FAIRSEQ_LANGUAGE_CODES['m2m100']]
    config = {'tokenizer_class': 'M2M100Tokenizer', 'language_codes': 'm2m100'}
    config |= {'additional_special_tokens': codes, 'src_lang': 'en', 'tgt_lang': 'de'}
    (directory / 'tokenizer_config.json').write_text(json.dumps(config, indent=2))
    return transformers.M2M100Tokenizer.from_pretrained(directory)


def both_ways(tokenizer, lines: dict[str, list[str]]) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) of every pair both ways, as M2M100Tokenizer lays them out."""
    pairs = []
    for source, target in (('en', 'de'), ('de', 'en')):
        tokenizer.src_lang, tokenizer.tgt_lang = source, target
        encoded = tokenizer(lines[source], text_target=lines[target])
        pairs += zip(encoded['input_ids'], encoded['labels'], strict=True)
    return pairs


def pretrain(args, hf_dir: pathlib.Path, splits: dict) -> dict:
    """Step 1 of the module docstring: the stand-in written to ``hf_dir``; its summary."""
    import sacrebleu
    import torch
    import transformers

    from benchmarks import hf_marian_pretrain

    torch.set_num_threads(2)
    torch.manual_seed(0)
    hf_dir.mkdir()
    half_a = splits['train_a']
    tokenizer = write_tokenizer(hf_dir, [*half_a['en'], *half_a['de']], args.spm_pieces)
    ids = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    config = transformers.M2M100Config(
        vocab_size=len(tokenizer), d_model=args.d_model, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model, activation_function='relu', dropout=0.1,
        attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=1024,
        scale_embedding=True, **ids,
    )  # fmt: skip
    model = transformers.M2M100ForConditionalGeneration(config)
    loop = SimpleNamespace(
        steps=args.pretrain_steps, minutes=float('inf'), lr=args.lr, warmup=args.warmup,
        max_tokens=args.max_tokens, label_smoothing=0.1, seed=0,
    )  # fmt: skip
    start = time.time()
    log = hf_marian_pretrain.train(model, both_ways(tokenizer, half_a), loop)
    log['pretrain_s'] = time.time() - start
    model.generation_config = transformers.GenerationConfig(max_length=200, **ids)
    model.save_pretrained(hf_dir)
    hypotheses = generate(model, tokenizer, splits['test2016']['en'], args.beam_size)
    write(hf_dir.parent / 'generate.test2016.txt', hypotheses)
    references = [splits['test2016']['de']]
    log['parameters'] = sum(p.numel() for p in model.parameters())
    log['vocab_size'] = len(tokenizer)
    return dict(
        log, sacrebleu=sacrebleu.corpus_bleu(hypotheses, references).score,
        chrf_plus_plus=sacrebleu.corpus_chrf(hypotheses, references, word_order=2).score,
    )  # fmt: skip


def generate(model, tokenizer, lines: list[str], beam_size: int, size: int = 32) -> list[str]:
    """`generate`'s English->German translations of ``lines``, by batches sorted by length."""
    import torch

    model.eval()
    tokenizer.src_lang = 'en'
    forced = tokenizer.get_lang_id('de')
    order, out = sorted(range(len(lines)), key=lambda i: len(lines[i])), [''] * len(lines)
    with torch.inference_mode():
        for k in range(0, len(order), size):
            batch = order[k : k + size]
            inputs = tokenizer([lines[i] for i in batch], return_tensors='pt', padding=True)
            ids = model.generate(
                **inputs, num_beams=beam_size, forced_bos_token_id=forced,
                max_new_tokens=inputs['input_ids'].shape[1] + 50,
            )  # fmt: skip
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            for i, text in zip(batch, texts, strict=True):
                out[i] = text
    return out


def run(command: list[str], work: pathlib.Path, name: str) -> float:
    """Runs ``command`` (its log: WORK/NAME.log); its wall time. A failure stops in its tail."""
    start = time.perf_counter()
    with open(work / f'{name}.log', 'w') as f:
        code = subprocess.call(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    if code:
        tail = '\n'.join(read(work / f'{name}.log')[-15:])
        raise SystemExit(f'fairseq_finetune.py: {name} failed (exit {code}):\n{tail}')
    return time.perf_counter() - start


def evaluate(work: pathlib.Path, name: str, pair: bool, beam_size: int) -> dict:
    """`transformer.evaluate` of WORK/NAME on test2016 (en->de); its scores and command."""
    data, output = work / 'data', work / f'{name}.test2016.txt'
    command = [
        sys.executable, '-m', 'transformer.evaluate', '--workdir', str(work / name),
        '--source', str(data / 'test2016.en'), '--reference', str(data / 'test2016.de'),
        '--beam_size', str(beam_size), '--output', str(output),
        *(['--source_lang', 'en', '--target_lang', 'de'] if pair else []),
    ]  # fmt: skip
    seconds = run(command, work, f'evaluate_{name}')
    scores = json.loads(output.with_suffix('.json').read_text())
    return {
        'sacrebleu': scores['sacrebleu'], 'chrf_plus_plus': scores['chrf++'],
        'evaluate_s': seconds, 'evaluate_command': shlex.join(command),
    }  # fmt: skip


def training(args, work: pathlib.Path, name: str, config: str, extra: list[str]) -> dict:
    """`train.py` of WORK/NAME on half B for --steps; its time and command."""
    data = work / 'data'
    command = [
        sys.executable, 'train.py', '--config', config, '--workdir', str(work / name),
        f'--config.train.num_steps={args.steps}', '--config.data.dataset=folder',
        f'--config.data.folder={data}', '--config.data.train_split=train_b', *extra,
        *(f'--config.{setting}' for setting in args.set),
    ]  # fmt: skip
    return {'train_s': run(command, work, f'train_{name}'), 'train_command': shlex.join(command)}


def scratch_flags(converted: pathlib.Path) -> list[str]:
    """The converted run's model shape and options as train.py flags (`SCRATCH_KEYS`)."""
    model = json.loads((converted / 'config.json').read_text())['model']
    return [f'--config.model.{k}={model[k]}' for k in SCRATCH_KEYS if model.get(k) is not None]


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    work = pathlib.Path(args.work).resolve()
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f'fairseq_finetune.py: {work} is not empty: give a new --work.')
    splits = write_folder(args.data, work / 'data', args.train_lines, args.sentences)
    report = {'settings': {k: v for k, v in vars(args).items() if k != 'out'}}
    report['generate'] = pretrain(args, work / 'hf', splits)
    print(json.dumps({'generate': report['generate']}), flush=True)
    command = [sys.executable, '-m', 'transformer.convert', '--from_hf', str(work / 'hf')]
    command += ['--workdir', str(work / 'converted')]
    report['converted'] = {'convert_s': run(command, work, 'convert')}
    report['converted'].update(evaluate(work, 'converted', True, args.beam_size))
    report['converted']['convert_command'] = shlex.join(command)
    pair = ['--config.data.source_lang_code=en', '--config.data.target_lang_code=de']
    init = [f'--config.train.init_from={work / "hf"}', *pair]
    report['finetuned'] = training(args, work, 'finetuned', 'configs/multi30k.py:finetune', init)
    report['finetuned'].update(evaluate(work, 'finetuned', True, args.beam_size))
    shape = scratch_flags(work / 'converted')
    report['scratch'] = training(args, work, 'scratch', 'configs/multi30k.py', shape)
    report['scratch'].update(evaluate(work, 'scratch', False, args.beam_size))
    for name in ('converted', 'finetuned', 'scratch'):
        print(json.dumps({name: report[name]}), flush=True)
    from benchmarks import common

    common.write_report(args.out, {
        **report, 'cpu': common.cpu_model(), 'cpu_count': os.cpu_count(),
        'date': datetime.datetime.now().isoformat(timespec='seconds'),
    })  # fmt: skip


if __name__ == '__main__':
    main()
