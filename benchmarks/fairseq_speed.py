"""Converting and decoding an NLLB-200-distilled-600M-shaped model: ours beside Hugging Face and
CTranslate2.

The model (default: NLLB-200-distilled-600M's shape, 12 + 12 layers, d_model 1024, 16 heads,
FFN 4096, ReLU, pre-LN with final norms, scale_embedding, fairseq's sinusoidal positions,
V = 256206 rows) is an `M2M100ForConditionalGeneration` with random weights (transformers' own
initialization, torch seed 0), saved as model.safetensors. Its `sentencepiece.bpe.model` is a
BPE model trained on Multi30k's train English and German (up to --spm_pieces pieces) to which
fillers ('▁fill000001', ...) are appended, so that its pieces, fairseq's four, the 202
FLORES-200 codes and `<mask>` are V - 2 ids, two rows short of the model's as NLLB-200's 256204
ids are of its 256206 rows; tokenizer_config.json registers them as the hub's does.

Each measured command runs in a process of its own, with its own wall time and peak RSS: our
convert, `evaluate --source --reference --source_lang eng_Latn --target_lang deu_Latn` (no
compilation cache) and `export --format ctranslate2`, Hugging Face's `generate` with
`forced_bos_token_id` deu_Latn, and CTranslate2's translate_batch with `target_prefix`
deu_Latn (their decode loops timed alone too), on the first --sentences of test2016, beam 4,
64 sentences a batch sorted by length. Random weights rarely emit EOS, so each decodes up to
its limit, as benchmarks/marian_speed.py says; output tokens: the generated ids after the
decoder's start, the target code and EOS included (ours: from its text, `piece_count`, + the
code, + EOS where the output ended before its limit, which the converted run's
`eval.eos_at_limit` 'none' ends without one, as `generate` does).
Figures: benchmarks/README.md.

    python benchmarks/fairseq_speed.py --out benchmarks/results/fairseq_speed.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import measured  # noqa: E402 (after the path above)
from benchmarks.measured import batches, measure, read, write  # noqa: E402
from transformer import files  # noqa: E402

DATA = REPO.parent / 'shared' / 'data' / 'multi30k'
SPM_FILE = 'sentencepiece.bpe.model'
PAIR = ('eng_Latn', 'deu_Latn')
EXTRA_ROWS = 2  # model rows past the tokenizer's ids, as NLLB-200's
NOT_PIECES = 204  # the tokenizer's ids besides the SentencePiece model's: <pad>, 202 codes, <mask>
MADE = ('run', 'ct2')
MARK = files.Mark('fairseq_speed.json', 'benchmarks/fairseq_speed.py')


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data', default=str(DATA), help='train.{en,de}, test2016.{en,de}')
    parser.add_argument('--work', default='/tmp/fairseq_speed', help='runs, outputs and logs')
    parser.add_argument('--hf_dir', default=None, help='default WORK/hf; reused if it exists')
    parser.add_argument('--d_model', type=int, default=1024, help='FFN: 4 x d_model')
    parser.add_argument('--layers', type=int, default=12, help='encoder layers = decoder layers')
    parser.add_argument('--heads', type=int, default=16)
    parser.add_argument('--vocab', type=int, default=256206, help="the model's embedding rows")
    parser.add_argument('--spm_pieces', type=int, default=8000, help='trained before the fillers')
    parser.add_argument('--sentences', type=int, default=200, help='first N of test2016')
    parser.add_argument('--beam_size', type=int, default=4)
    parser.add_argument('--batch_size', type=int, default=64, help='sentences per batch')
    parser.add_argument('--threads', type=int, default=2, help='torch and CTranslate2 threads')
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/fairseq_speed.json'))
    return parser.parse_args(argv)


def spm_with_fillers(lines: list[str], trained: int, pieces: int) -> bytes:
    """`measured.spm_with_fillers` (BPE), with a --vocab too small for what was learnt one line."""
    try:
        return measured.spm_with_fillers(lines, trained, pieces)
    except ValueError as error:
        least = int(str(error)) + NOT_PIECES + EXTRA_ROWS
        raise SystemExit(
            f'fairseq_speed.py: --vocab must be at least {least} for the {error} pieces '
            'trained (or give a smaller --spm_pieces).'
        ) from None


def tokenizer_config(pieces: int) -> dict:
    """NLLB-200's hub tokenizer_config.json for a model of ``pieces`` SentencePiece pieces:
    fairseq's four at 0-3, the codes from ``pieces + 1`` on, ``<mask>`` last."""
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as CODES

    tokens = ['<s>', '<pad>', '</s>', '<unk>', *CODES, '<mask>']
    ids = [*range(4), *range(pieces + 1, pieces + 2 + len(CODES))]
    entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    registered = {str(i): {**entry, 'content': t} for i, t in zip(ids, tokens, strict=True)}
    registered[str(ids[-1])].update(lstrip=True, normalized=True)
    return {
        'tokenizer_class': 'NllbTokenizer', 'src_lang': PAIR[0], 'tgt_lang': PAIR[1],
        'additional_special_tokens': list(CODES), 'added_tokens_decoder': registered,
        'model_max_length': 1024, 'legacy_behaviour': False,
    }  # fmt: skip


def build_hf_dir(directory, result, data, d_model, layers, heads, vocab, spm_pieces) -> None:
    """Writes the random NLLB-200-shaped directory (module docstring), built in a temporary
    sibling and renamed (`files.write_in_place`: an interrupted build leaves nothing to reuse)."""
    summary = {}

    def build(scratch: str) -> str:
        staging = pathlib.Path(scratch, 'hf')
        staging.mkdir()
        summary.update(_build_hf(staging, data, (d_model, layers, heads, vocab), spm_pieces))
        return str(staging)

    files.write_in_place(directory, build)
    measured.write_json(result, summary)


def _build_hf(staging: pathlib.Path, data, sizes, spm_pieces) -> dict:
    import torch
    import transformers

    d_model, layers, heads, vocab = sizes
    texts = [*read(f'{data}/train.en'), *read(f'{data}/train.de')]
    pieces = vocab - EXTRA_ROWS - NOT_PIECES  # the SentencePiece model's
    (staging / SPM_FILE).write_bytes(spm_with_fillers(texts, spm_pieces, pieces))
    measured.write_json(staging / 'tokenizer_config.json', tokenizer_config(pieces))
    ids = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    config = transformers.M2M100Config(
        vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model, activation_function='relu',
        max_position_embeddings=1024, scale_embedding=True, tie_word_embeddings=True,
        architectures=['M2M100ForConditionalGeneration'], **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.M2M100ForConditionalGeneration(config).eval()
    model.generation_config = transformers.GenerationConfig(max_length=200, **ids)
    model.save_pretrained(staging)  # model.safetensors
    parameters = sum(p.numel() for p in model.parameters())
    return {'spm_pieces': pieces, 'parameters': parameters}


def hf_dir_of(args, directory: str, work: pathlib.Path) -> dict:
    """Builds ``directory`` (in a child: its time and peak RSS) or checks that the one there
    has the sizes asked for."""
    if not os.path.isfile(f'{directory}/config.json'):
        if os.path.isdir(directory) and os.listdir(directory):
            raise SystemExit(f'fairseq_speed.py: {directory} has no config.json: name another.')
        names = ('data', 'd_model', 'layers', 'heads', 'vocab', 'spm_pieces')
        kwargs = {k: getattr(args, k) for k in names}
        return run_child('build_hf_dir', dict(kwargs, directory=directory), work)
    config = json.loads(pathlib.Path(directory, 'config.json').read_text())
    asked = {'d_model': args.d_model, 'encoder_layers': args.layers, 'vocab_size': args.vocab}
    found = {key: config.get(key) for key in asked}
    if found != asked:
        raise SystemExit(f'fairseq_speed.py: {directory} has {found}, not {asked}: remove it.')
    return {'measurement': 'build_hf_dir', 'reused': directory}


def decode_hf(hf_dir, source, result, threads, beam_size, batch_size, extra_length) -> None:
    """M2M100ForConditionalGeneration.generate on ``source``'s lines, deu_Latn forced first;
    writes the outputs and times to ``result``."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    start = time.perf_counter()
    tokenizer = transformers.NllbTokenizer.from_pretrained(hf_dir, src_lang=PAIR[0])
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(hf_dir).eval()
    forced = tokenizer.convert_tokens_to_ids(PAIR[1])
    loaded = time.perf_counter()
    hypotheses, tokens = measured.generate(  # (the code and EOS count in the limit)
        tokenizer, model, read(source), beam_size, batch_size, extra_length,
        forced_bos_token_id=forced,
    )  # fmt: skip
    times = dict(load_s=loaded - start, decode_s=time.perf_counter() - loaded)
    measured.write_json(result, dict(times, output_tokens=tokens, hypotheses=hypotheses))


def decode_ct2(ct2_dir, source, result, threads, beam_size, batch_size, extra_length) -> None:
    """Translator.translate_batch of our CTranslate2 export on ``source``'s lines, the source
    ``eng_Latn X </s>`` and deu_Latn its target_prefix; as `decode_hf`."""
    import ctranslate2
    import sentencepiece as spm

    start = time.perf_counter()
    translator = ctranslate2.Translator(ct2_dir, 'cpu', inter_threads=1, intra_threads=threads)
    sp = spm.SentencePieceProcessor(model_file=f'{ct2_dir}/{SPM_FILE}')
    loaded = time.perf_counter()
    lines = read(source)
    pieces = [[PAIR[0], *sp.encode(line, out_type=str), '</s>'] for line in lines]
    hypotheses, tokens = [''] * len(lines), 0
    for batch in batches([len(p) for p in pieces], batch_size):
        results = translator.translate_batch(
            [pieces[i] for i in batch], target_prefix=[[PAIR[1]]] * len(batch),
            beam_size=beam_size, max_batch_size=batch_size, suppress_sequences=[['<pad>']],
            max_decoding_length=max(len(pieces[i]) for i in batch) + extra_length,
            return_end_token=True,
        )  # fmt: skip
        for i, r in zip(batch, results, strict=True):
            tokens += len(r.hypotheses[0])  # the target code first
            text = [p for p in r.hypotheses[0][1:] if sp.piece_to_id(p) > 2]  # no codes
            hypotheses[i] = sp.decode_pieces(text)
    times = dict(load_s=loaded - start, decode_s=time.perf_counter() - loaded)
    measured.write_json(result, dict(times, output_tokens=tokens, hypotheses=hypotheses))


CHILDREN = {'build_hf_dir': build_hf_dir, 'decode_hf': decode_hf, 'decode_ct2': decode_ct2}


@dataclasses.dataclass(frozen=True)
class Family:
    """What the decode loop (`decodes`, `token_counter`, `decode_and_report`) needs to know of
    a benchmark's family of models."""

    module: str  # the benchmarks module whose CHILDREN hold its decode_hf and decode_ct2
    spm_file: str  # the SentencePiece model in its Hugging Face directory
    target_flags: tuple[str, ...]  # evaluate's flags that choose the target language
    code_first: bool  # each output starts with the target's code (an output token)
    mark: files.Mark  # what the script writes in each directory it makes (`MADE`)


NLLB = Family(
    'fairseq_speed', SPM_FILE, ('--source_lang', PAIR[0], '--target_lang', PAIR[1]), True, MARK
)


def run_child(name: str, kwargs: dict, work: pathlib.Path) -> dict:
    """`measured.run_child` of `CHILDREN`'s ``name``."""
    return measured.run_child('fairseq_speed', name, kwargs, work)


def decodes(args, work: pathlib.Path, extra_length: int, family: Family):
    """Yields each measurement of decoding (and of our CTranslate2 export) as it ends; the
    decodes with their ``hypotheses``."""
    source, output = work / 'source.en', work / 'ours.txt'
    result = measure('decode_ours', [
        sys.executable, '-m', 'transformer.evaluate', '--workdir', str(work / 'run'),
        '--source', str(source), '--reference', str(work / 'reference.de'),
        *family.target_flags, '--beam_size', str(args.beam_size),
        '--batch_size', str(args.batch_size), '--output', str(output),
    ], work, no_cache=True)  # fmt: skip
    scores = json.loads(output.with_suffix('.json').read_text())
    yield dict(result, run_wall_time_s=scores['wall_time_s'], hypotheses=read(output))
    ct2_dir = str(work / 'ct2')
    yield measure('export_ct2', [
        sys.executable, '-m', 'transformer.export', '--workdir', str(work / 'run'),
        '--out', ct2_dir, '--format', 'ctranslate2',
    ], work)  # fmt: skip
    family.mark.write(ct2_dir)
    shared = dict(source=str(source), threads=args.threads, beam_size=args.beam_size)
    shared.update(batch_size=args.batch_size, extra_length=extra_length)
    for name, directory in (
        ('decode_hf', {'hf_dir': args.hf_dir}),
        ('decode_ct2', {'ct2_dir': ct2_dir}),
    ):
        yield measured.run_child(family.module, name, dict(shared, **directory), work)


def token_counter(args, work: pathlib.Path, extra_length: int, family: Family):
    """A function that adds to a decode's measurement its output tokens, the sum of its limits
    and its speeds: over the decode alone (ours: over the evaluate run's wall_time_s,
    compilation included) and over the whole command."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=f'{args.hf_dir}/{family.spm_file}')
    pieces = {sp.id_to_piece(i) for i in range(len(sp))} - {'<s>', '</s>', '<unk>', '<pad>'}
    longest = max(map(len, pieces))
    lengths = [len(ids) + 2 for ids in sp.encode(read(work / 'source.en'))]  # code/tag, EOS
    limits = {'decode_ours': sum(lengths) + len(lengths) * extra_length}
    limits['decode_hf'] = limits['decode_ct2'] = sum(
        len(b) * (max(lengths[i] for i in b) + extra_length)
        for b in batches(lengths, args.batch_size)
    )

    def count(result: dict) -> None:
        name, hypotheses = result['measurement'], result.pop('hypotheses')
        write(work / f'{name}.txt', hypotheses)
        spelled = [measured.piece_count(h, pieces, longest) for h in hypotheses]
        text_pieces = sum(spelled)
        if name == 'decode_ours':  # the code, the text, EOS where it ended before its limit
            ends, code = zip(spelled, lengths, strict=True), int(family.code_first)
            result['output_tokens'] = sum(min(code + n + 1, m + extra_length) for n, m in ends)
        seconds = result.get('decode_s') or result['run_wall_time_s']
        result.update(hypotheses=len(hypotheses), limit_tokens=limits[name])
        result.update(text_pieces=text_pieces, sentences_per_s=len(hypotheses) / seconds)
        result['tokens_per_s'] = result['output_tokens'] / seconds
        result['tokens_per_command_s'] = result['output_tokens'] / result['command_s']

    return count


def decode_and_report(args, work, results: list, family: Family, load_before: float, **report):
    """After our convert into WORK/run: each decode measured and counted (printed as it
    ends), and the report written to ``args.out`` with ``results``, the settings, the host
    (the 1-minute load average ``load_before`` the run and after it), the packages' versions
    and ``report``'s fields."""
    from benchmarks import common

    extra_length = json.loads((work / 'run/config.json').read_text())['eval']['extra_length']
    count = token_counter(args, work, extra_length, family)
    for result in decodes(args, work, extra_length, family):
        if 'hypotheses' in result:
            count(result)
        results.append(result)
        print(json.dumps(result), flush=True)
    packages = ('jax', 'torch', 'transformers', 'ctranslate2')
    common.write_report(args.out, {
        'settings': {k: v for k, v in vars(args).items() if k != 'out'},
        'extra_length': extra_length, **report,
        'cpu': common.cpu_model(), 'cpu_count': os.cpu_count(),
        'load_average_1min_before_after': [load_before, os.getloadavg()[0]],
        **{name: importlib.metadata.version(name) for name in packages},
        'date': datetime.datetime.now().isoformat(timespec='seconds'),
        'results': results,
    })  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    load_before = os.getloadavg()[0]  # other jobs on the machine make the timings noisy
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.hf_dir = os.path.abspath(args.hf_dir or work / 'hf')
    results = [hf_dir_of(args, args.hf_dir, work)]
    print(json.dumps(results[-1]), flush=True)
    write(work / 'source.en', read(f'{args.data}/test2016.en')[: args.sentences])
    write(work / 'reference.de', read(f'{args.data}/test2016.de')[: args.sentences])
    measured.clear_previous(work, MADE, MARK)
    command = [sys.executable, '-m', 'transformer.convert', '--from_hf', args.hf_dir]
    results.append(measure('convert_ours', [*command, '--workdir', str(work / 'run')], work))
    MARK.write(str(work / 'run'))
    print(json.dumps(results[-1]), flush=True)
    decode_and_report(args, work, results, NLLB, load_before)


if __name__ == '__main__':
    main()
