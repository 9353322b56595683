"""Converting and decoding an OPUS-MT-sized MarianMT: ours beside Hugging Face and CTranslate2.

The MarianMT (default: opus-mt-en-de's sizes, 6 + 6 layers, d_model 512, 8 heads, FFN 2048,
swish, V = 58101) has random weights (transformers' own initialization, torch seed 0) and
SentencePiece unigram models of Multi30k's train English and German; vocab.json (`entries`):
'</s>', '<unk>', both models' pieces, fillers ('▁fill00001', ...) up to V-1 entries, '<pad>'
(`--layout classic`, OPUS-MT's first generation), or with `--layout tc` as the
Tatoeba-Challenge generation (opus-mt-tc-*) places them: '</s>' at 80% of V, '<unk>' at 95%,
'<pad>' (the decoder's start) last, and relu. Each
measured command runs in a process of its own, with its own wall time and peak RSS: our
convert and evaluate commands (no compilation cache), CTranslate2's converter, generate and
translate_batch (their decode loops timed alone too) on the first --sentences of test2016, beam
4, 64 sentences a batch sorted by length. Random weights rarely emit EOS, so each decodes up to
its limit: input length (EOS included) + the run's eval.extra_length, ours per sentence, the
others per batch from its longest input. output_tokens: the generated ids, EOS included where
produced (ours: from its text, `piece_count`). Figures: benchmarks/README.md.

    python benchmarks/marian_speed.py --out benchmarks/results/marian_speed.json
    python benchmarks/marian_speed.py --d_model 64 --layers 1 --vocab 20000 --sentences 20 \
        --work /tmp/marian_speed_small --out /tmp/marian_speed_small.json   # a quick check
    python benchmarks/marian_speed.py --layout tc --d_model 1024 --heads 16 --vocab 57000 \
        --sentences 200 --work /tmp/marian_speed_tc_big \
        --out benchmarks/results/marian_speed_tc_big.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import io
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import measured  # noqa: E402 (after the path above)
from benchmarks.measured import batches, measure, piece_count, read, write  # noqa: E402, F401
from transformer import files  # noqa: E402

DATA = REPO.parent / 'shared' / 'data' / 'multi30k'
SPM_VOCAB = 8000  # pieces of each SentencePiece model (fewer where the text has fewer)
SPECIAL = {'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}
CT2_CONVERT = (
    'import sys, ctranslate2; '
    'ctranslate2.converters.TransformersConverter(sys.argv[1]).convert(sys.argv[2])'
)
# What main makes in --work and removes at its next start: each directory holds MARK, which
# lists every file in it; a directory of that name without it is not removed (`clear_previous`).
MADE = ('run', 'ct2')
LAYOUTS = {'classic': 'swish', 'tc': 'relu'}  # where vocab.json puts '</s>'...; the activation
MARK = files.Mark('marian_speed.json', 'benchmarks/marian_speed.py')


def clear_previous(work: pathlib.Path) -> None:
    """Removes the `MADE` directories a run before left in ``work`` (`measured.clear_previous`)."""
    measured.clear_previous(work, MADE, MARK)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data', default=str(DATA), help='train.{en,de}, test2016.{en,de}')
    parser.add_argument('--work', default='/tmp/marian_speed', help='runs, outputs and logs')
    parser.add_argument('--hf_dir', default=None, help='default WORK/hf; reused if it exists')
    parser.add_argument('--d_model', type=int, default=512, help='FFN: 4 x d_model')
    parser.add_argument('--layers', type=int, default=6, help='encoder layers = decoder layers')
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument('--vocab', type=int, default=58101, help="vocab.json's entries")
    parser.add_argument('--layout', choices=list(LAYOUTS), default='classic', help='`entries`')
    parser.add_argument('--sentences', type=int, default=500, help='first N of test2016')
    parser.add_argument('--beam_size', type=int, default=4)
    parser.add_argument('--batch_size', type=int, default=64, help='sentences per batch')
    parser.add_argument('--threads', type=int, default=2, help='torch and CTranslate2 threads')
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/marian_speed.json'))
    return parser.parse_args(argv)


def _spm_pieces(spm, directory: str, side: str, lines: list[str]) -> list[str]:
    """Trains ``side``.spm (unigram) on ``lines`` into ``directory``; its real pieces."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=SPM_VOCAB,
        model_type='unigram', hard_vocab_limit=False, num_threads=2, minloglevel=2,
    )  # fmt: skip
    pathlib.Path(directory, f'{side}.spm').write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    special = (sp.is_unknown, sp.is_control, sp.is_unused)
    return [sp.id_to_piece(i) for i in range(len(sp)) if not any(f(i) for f in special)]


def entries(pieces: list[str], vocab: int, layout: str) -> list[str]:
    """vocab.json's entries in id order: ``pieces``, fillers up to ``vocab``, and '</s>',
    '<unk>' and '<pad>' where ``layout`` puts them (module docstring)."""
    fillers = vocab - 3 - len(pieces)
    if fillers < 0:
        raise SystemExit(f'marian_speed.py: --vocab must be at least {len(pieces) + 3}.')
    body = [*pieces, *(f'▁fill{i:05d}' for i in range(1, fillers + 1))]
    if layout == 'classic':
        return ['</s>', '<unk>', *body, '<pad>']
    eos, unk = int(0.8 * vocab), int(0.95 * vocab)
    body.insert(eos, '</s>')
    body.insert(unk, '<unk>')
    return [*body, '<pad>']


def build_hf_dir(directory, result, data, d_model, layers, heads, vocab, layout) -> None:
    """Writes the random MarianMT directory as OPUS-MT's hub repositories hold one (built
    in a temporary sibling and renamed, `files.write_in_place`: an interrupted build leaves
    no directory to reuse)."""
    parameters = []

    def build(scratch: str) -> str:
        staging = os.path.join(scratch, 'hf')
        os.makedirs(staging)
        _build_hf(staging, data, (d_model, layers, heads, vocab), layout, parameters)
        return staging

    files.write_in_place(directory, build)
    measured.write_json(
        result, dict(zip(('pieces', 'fillers', 'parameters'), parameters, strict=True))
    )


def _build_hf(staging, data, sizes, layout, summary: list) -> None:
    import sentencepiece as spm
    import torch
    import transformers

    d_model, layers, heads, vocab = sizes
    pieces = []
    for side, lang in (('source', 'en'), ('target', 'de')):
        pieces += _spm_pieces(spm, staging, side, read(f'{data}/train.{lang}'))
    pieces = [p for p in dict.fromkeys(pieces) if p not in ('</s>', '<unk>', '<pad>')]
    fillers = vocab - 3 - len(pieces)
    ids_of = {p: i for i, p in enumerate(entries(pieces, vocab, layout))}
    measured.write_json(f'{staging}/vocab.json', ids_of)
    measured.write_json(f'{staging}/special_tokens_map.json', SPECIAL)
    measured.write_json(f'{staging}/tokenizer_config.json', {
        'source_lang': 'en', 'target_lang': 'de', 'separate_vocabs': False,
        'model_max_length': 512, 'sp_model_kwargs': {}, 'tokenizer_class': 'MarianTokenizer',
        **SPECIAL,
    })  # fmt: skip
    pad, eos = ids_of['<pad>'], ids_of['</s>']
    ids = dict(pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad)
    ids.update(forced_eos_token_id=eos)
    config = transformers.MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=d_model,
        encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model,
        activation_function=LAYOUTS[layout], max_position_embeddings=512, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        architectures=['MarianMTModel'], **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    model.generation_config = transformers.GenerationConfig(
        num_beams=4, length_penalty=1.0, max_length=512, bad_words_ids=[[pad]], **ids
    )
    model.save_pretrained(staging)
    summary += [len(pieces), fillers, sum(p.numel() for p in model.parameters())]


def hf_dir_of(args, directory: str, work: pathlib.Path) -> dict:
    """Builds ``directory`` (in a child: its time and peak RSS) or checks that the one there
    has the sizes asked for."""
    if not os.path.isfile(f'{directory}/config.json'):
        if os.path.isdir(directory) and os.listdir(directory):
            raise SystemExit(f'marian_speed.py: {directory} has no config.json: name another.')
        names = ('data', 'd_model', 'layers', 'heads', 'vocab', 'layout')
        kwargs = {k: getattr(args, k) for k in names}
        return run_child('build_hf_dir', dict(kwargs, directory=directory), work)
    config = json.loads(pathlib.Path(directory, 'config.json').read_text())
    asked = {'d_model': args.d_model, 'encoder_layers': args.layers, 'vocab_size': args.vocab}
    asked['activation_function'] = LAYOUTS[args.layout]
    found = {key: config.get(key) for key in asked}
    if found != asked:
        raise SystemExit(f'marian_speed.py: {directory} has {found}, not {asked}: remove it.')
    return {'measurement': 'build_hf_dir', 'reused': directory}


def decode_hf(hf_dir, source, result, threads, beam_size, batch_size, extra_length) -> None:
    """MarianMTModel.generate on ``source``'s lines; writes the outputs and times to ``result``."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    start = time.perf_counter()
    tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)
    model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    loaded = time.perf_counter()
    hypotheses, tokens = measured.generate(
        tokenizer, model, read(source), beam_size, batch_size, extra_length
    )
    times = dict(load_s=loaded - start, decode_s=time.perf_counter() - loaded)
    measured.write_json(result, dict(times, output_tokens=tokens, hypotheses=hypotheses))


def decode_ct2(ct2_dir, hf_dir, source, result, threads, beam_size, batch_size, extra_length):
    """Translator.translate_batch on ``source``'s lines, as `decode_hf`."""
    import ctranslate2
    import sentencepiece as spm

    start = time.perf_counter()
    translator = ctranslate2.Translator(ct2_dir, 'cpu', inter_threads=1, intra_threads=threads)
    source_spm = spm.SentencePieceProcessor(model_file=f'{hf_dir}/source.spm')
    target_spm = spm.SentencePieceProcessor(model_file=f'{hf_dir}/target.spm')
    loaded = time.perf_counter()
    lines = read(source)
    pieces = [[*source_spm.encode(line, out_type=str), '</s>'] for line in lines]
    hypotheses, tokens = [''] * len(lines), 0
    for batch in batches([len(p) for p in pieces], batch_size):
        results = translator.translate_batch(
            [pieces[i] for i in batch], beam_size=beam_size, max_batch_size=batch_size,
            max_decoding_length=max(len(pieces[i]) for i in batch) + extra_length,
            return_end_token=True,
        )  # fmt: skip
        for i, r in zip(batch, results, strict=True):
            tokens += len(r.hypotheses[0])
            hypotheses[i] = target_spm.decode_pieces([p for p in r.hypotheses[0] if p != '</s>'])
    times = dict(load_s=loaded - start, decode_s=time.perf_counter() - loaded)
    measured.write_json(result, dict(times, output_tokens=tokens, hypotheses=hypotheses))


CHILDREN = {'build_hf_dir': build_hf_dir, 'decode_hf': decode_hf, 'decode_ct2': decode_ct2}


def run_child(name: str, kwargs: dict, work: pathlib.Path) -> dict:
    """`measured.run_child` of `CHILDREN`'s ``name``."""
    return measured.run_child('marian_speed', name, kwargs, work)


def decodes(args, hf_dir: str, work: pathlib.Path, extra_length: int):
    """Yields each measurement of decoding (and CTranslate2's conversion) as it ends; the
    decodes with their ``hypotheses``."""
    source, output = work / 'source.en', work / 'ours.txt'
    result = measure('decode_ours', [
        sys.executable, '-m', 'transformer.evaluate', '--workdir', str(work / 'run'),
        '--source', str(source), '--reference', str(work / 'reference.de'), '--beam_size',
        str(args.beam_size), '--batch_size', str(args.batch_size), '--output', str(output),
    ], work, no_cache=True)  # fmt: skip
    scores = json.loads(output.with_suffix('.json').read_text())
    yield dict(result, run_wall_time_s=scores['wall_time_s'], hypotheses=read(output))
    ct2_dir = str(work / 'ct2')
    yield measure('convert_ct2', [sys.executable, '-c', CT2_CONVERT, hf_dir, ct2_dir], work)
    MARK.write(ct2_dir)
    shared = dict(hf_dir=hf_dir, source=str(source), threads=args.threads)
    shared.update(beam_size=args.beam_size, batch_size=args.batch_size, extra_length=extra_length)
    yield run_child('decode_hf', shared, work)
    yield run_child('decode_ct2', dict(shared, ct2_dir=ct2_dir), work)


def token_counter(args, hf_dir: str, work: pathlib.Path, extra_length: int):
    """A function that adds to a decode's measurement its output tokens (EOS included), the sum
    of its limits and its speeds: over the decode alone (ours: over the evaluate run's
    wall_time_s, compilation included) and over the whole command."""
    import sentencepiece as spm

    vocab = json.loads(pathlib.Path(hf_dir, 'vocab.json').read_text(encoding='utf-8'))
    pieces = set(vocab) - {'</s>', '<unk>', '<pad>'}
    longest = max(map(len, pieces))
    source = spm.SentencePieceProcessor(model_file=f'{hf_dir}/source.spm')
    lengths = [len(ids) + 1 for ids in source.encode(read(work / 'source.en'))]  # + EOS
    limits = {'decode_ours': sum(lengths) + len(lengths) * extra_length}
    limits['decode_hf'] = limits['decode_ct2'] = sum(
        len(b) * (max(lengths[i] for i in b) + extra_length)
        for b in batches(lengths, args.batch_size)
    )

    def count(result: dict) -> None:
        name, hypotheses = result['measurement'], result.pop('hypotheses')
        write(work / f'{name}.txt', hypotheses)
        text_pieces = sum(piece_count(h, pieces, longest) for h in hypotheses)
        if name == 'decode_ours':  # our search ends every output with EOS (forced at its limit)
            result['output_tokens'] = text_pieces + len(hypotheses)
        seconds = result.get('decode_s') or result['run_wall_time_s']
        result.update(hypotheses=len(hypotheses), limit_tokens=limits[name])
        result.update(text_pieces=text_pieces, sentences_per_s=len(hypotheses) / seconds)
        result['tokens_per_s'] = result['output_tokens'] / seconds
        result['tokens_per_command_s'] = result['output_tokens'] / result['command_s']

    return count


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    load_before = os.getloadavg()[0]  # other jobs on the machine make the timings noisy
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = os.path.abspath(args.hf_dir or work / 'hf')
    results = [hf_dir_of(args, hf_dir, work)]
    print(json.dumps(results[-1]), flush=True)
    write(work / 'source.en', read(f'{args.data}/test2016.en')[: args.sentences])
    write(work / 'reference.de', read(f'{args.data}/test2016.de')[: args.sentences])
    clear_previous(work)
    command = [sys.executable, '-m', 'transformer.convert', '--from_hf', hf_dir, '--workdir']
    results.append(measure('convert_ours', [*command, str(work / 'run')], work, no_cache=True))
    MARK.write(str(work / 'run'))
    print(json.dumps(results[-1]), flush=True)
    extra_length = json.loads((work / 'run/config.json').read_text())['eval']['extra_length']
    count = token_counter(args, hf_dir, work, extra_length)
    for result in decodes(args, hf_dir, work, extra_length):
        if 'hypotheses' in result:
            count(result)
        results.append(result)
        print(json.dumps(result), flush=True)
    from benchmarks import common

    packages = ('jax', 'torch', 'transformers', 'ctranslate2')
    common.write_report(args.out, {
        'settings': {k: v for k, v in vars(args).items() if k != 'out'},
        'hf_dir': hf_dir, 'extra_length': extra_length,
        'cpu': common.cpu_model(), 'cpu_count': os.cpu_count(),
        'load_average_1min_before_after': [load_before, os.getloadavg()[0]],
        **{name: importlib.metadata.version(name) for name in packages},
        'date': datetime.datetime.now().isoformat(timespec='seconds'),
        'results': results,
    })  # fmt: skip


if __name__ == '__main__':
    main()
