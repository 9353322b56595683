"""Converting and decoding a MADLAD-400-3B-shaped T5 cut to a few layers: ours beside Hugging
Face and CTranslate2, and convert's time and peak host memory projected to the whole depth.

The model (default: MADLAD-400-3B's shape cut to 4 + 4 layers: d_model 1024, 16 heads of d_kv
128, FFN 8192, gated tanh GELU, T5's relative position buckets (32, max distance 128),
V = 256000 rows, a head of its own) is a `T5ForConditionalGeneration` with random weights
(transformers' own initialization, torch seed 0; the head drawn apart from the embedding, as
transformers 5 ties it whatever the config says), saved by ``save_pretrained`` in safetensors
shards of --shard_size, its config.json as the hub's (tie_word_embeddings false). Its
spiece.model is a unigram SentencePiece model trained on Multi30k's train English and German
(up to --spm_pieces pieces) with T5's ids (pad 0, eos 1, unk 2) and MADLAD-400's ``<2xx>``
tags (`TAGS`) as user-defined pieces, padded with fillers (`measured.spm_with_fillers`) to
V - 100 pieces: T5's 100 sentinels make up V.

Each measured command runs in a process of its own, with its own wall time and peak RSS: our
convert of the model and of the same model at --small_layers (a directory of its own, the same
spiece.model), ``evaluate --source --reference --source_tag '<2de>'`` (no compilation cache)
and ``export --format ctranslate2``, Hugging Face's ``generate`` on ``'<2de> ' + sentence``
(as MADLAD-400's model card tags a source) and CTranslate2's translate_batch on the pieces
``['<2de>', ..., '</s>']`` (their decode loops timed alone too), on the first --sentences of
test2016 English, beam 4, 64 sentences a batch sorted by length. Random weights rarely emit
EOS, so each decodes up to its limit, as benchmarks/marian_speed.py says; output tokens, the
same for the three: the generated ids after the decoder's start, EOS included where produced
(ours: from its text, `measured.piece_count`, + EOS where the output ended before its limit,
which the converted run's ``eval.eos_at_limit`` 'none' ends without one, as ``generate``
does; `fairseq_speed.token_counter`). A sentinel has no text: ours' count leaves out any it
emits, the others' do not (`text_pieces`, the pieces of the text, is one count for all three).

The projection: convert's peak RSS and command time at --small_layers and --layers taken as
linear in the layers per stack, from these two measurements (not from the parameter counts):
per layer (an encoder and a decoder layer) their difference over the layers between, fixed
the rest (the interpreter and imports, the embedding and the head, the vocabulary), projected
to --project_layers (MADLAD-400-3B: 32 + 32), beside the float32 size of each model from its
tensor shapes (benchmarks/convert_memory.py). At the default sizes (826M parameters at 4 + 4,
675M at 2 + 2, 2.94B at 32 + 32) the directories under --work take about 15 GiB: each model in
float32 as hf and run, and 4 + 4's CTranslate2 export. Figures: benchmarks/README.md.

    python benchmarks/t5_speed.py --out benchmarks/results/t5_speed.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import convert_memory, fairseq_speed, measured  # noqa: E402 (after the path)
from benchmarks.measured import batches, measure, read, write  # noqa: E402
from transformer import files  # noqa: E402

DATA = REPO.parent / 'shared' / 'data' / 'multi30k'
SPM_FILE = 'spiece.model'
SENTINELS = 100  # T5Tokenizer's <extra_id_N> after the pieces
TAG = '<2de>'
TAGS = ('<2de>', '<2en>', '<2fr>', '<2es>')  # a few of MADLAD-400's target-language pieces
MADE = ('run', 'run_small', 'ct2')
MARK = files.Mark('t5_speed.json', 'benchmarks/t5_speed.py')
T5 = fairseq_speed.Family('t5_speed', SPM_FILE, ('--source_tag', TAG), False, MARK)
MIB = 2**20


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data', default=str(DATA), help='train.{en,de}, test2016.{en,de}')
    parser.add_argument('--work', default='/tmp/t5_speed', help='runs, outputs and logs')
    parser.add_argument('--hf_dir', default=None, help='default WORK/hf; reused if it exists')
    for name, default in (('d_model', 1024), ('heads', 16), ('d_kv', 128), ('d_ff', 8192)):
        parser.add_argument(f'--{name}', type=int, default=default)
    parser.add_argument('--layers', type=int, default=4, help='encoder layers = decoder layers')
    parser.add_argument('--small_layers', type=int, default=2, help="convert's second size")
    parser.add_argument('--project_layers', type=int, default=32, help='MADLAD-400-3B: 32')
    parser.add_argument('--vocab', type=int, default=256000, help="the model's embedding rows")
    parser.add_argument('--spm_pieces', type=int, default=8000, help='trained before the fillers')
    parser.add_argument('--shard_size', default='2GB', help="save_pretrained's max_shard_size")
    parser.add_argument('--sentences', type=int, default=100, help='first N of test2016')
    parser.add_argument('--beam_size', type=int, default=4)
    parser.add_argument('--batch_size', type=int, default=64, help='sentences per batch')
    parser.add_argument('--threads', type=int, default=2, help='torch and CTranslate2 threads')
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/t5_speed.json'))
    args = parser.parse_args(argv)
    if not 0 < args.small_layers < args.layers:
        raise SystemExit(
            f't5_speed.py: --small_layers {args.small_layers} must be at least 1 and fewer '
            f'than --layers {args.layers} (the two sizes convert is measured at).'
        )
    return args


def shape_of(args, layers: int) -> dict:
    """The model's sizes as `convert_memory.tensor_shapes` takes them."""
    sizes = dict(d=args.d_model, heads=args.heads, d_kv=args.d_kv, d_ff=args.d_ff)
    return dict(sizes, layers=layers, vocab=args.vocab)


def build_hf_dir(directory, result, data, shape, spm_pieces, shard_size, spiece=None) -> None:
    """Writes the random T5 directory of ``shape`` (module docstring; ``spiece``: a
    spiece.model to copy rather than train), built in a temporary sibling and renamed
    (`files.write_in_place`: an interrupted build leaves nothing to reuse)."""
    summary = {}

    def build(scratch: str) -> str:
        staging = pathlib.Path(scratch, 'hf')
        staging.mkdir()
        if spiece:
            shutil.copy(spiece, staging / SPM_FILE)
        else:
            texts = [*read(f'{data}/train.en'), *read(f'{data}/train.de')]
            (staging / SPM_FILE).write_bytes(spiece_model(texts, spm_pieces, shape['vocab']))
        summary.update(_build_hf(staging, shape, shard_size))
        return str(staging)

    files.write_in_place(directory, build)
    measured.write_json(result, summary)


def spiece_model(lines: list[str], trained: int, vocab: int) -> bytes:
    """spiece.model (module docstring): ``vocab`` - `SENTINELS` pieces."""
    options = dict(model_type='unigram', pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    try:
        return measured.spm_with_fillers(
            lines, trained, vocab - SENTINELS, user_defined_symbols=list(TAGS), **options
        )
    except ValueError as error:
        raise SystemExit(
            f't5_speed.py: --vocab must be at least {int(str(error)) + SENTINELS} for the '
            f'{error} pieces trained (or give a smaller --spm_pieces).'
        ) from None


def _build_hf(staging: pathlib.Path, shape: dict, shard_size: str) -> dict:
    import torch
    import transformers

    ids = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    config = transformers.T5Config(
        vocab_size=shape['vocab'], d_model=shape['d'], d_kv=shape['d_kv'], d_ff=shape['d_ff'],
        num_layers=shape['layers'], num_decoder_layers=shape['layers'], num_heads=shape['heads'],
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj='gated-gelu', tie_word_embeddings=False, layer_norm_epsilon=1e-6,
        dropout_rate=0.0, architectures=['T5ForConditionalGeneration'], **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    head = torch.empty(shape['vocab'], shape['d']).normal_(0.0, 1.0)  # T5's init of a head
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(staging, max_shard_size=shard_size)
    hub = json.loads((staging / 'config.json').read_text())
    hub.pop('scale_decoder_outputs', None)  # transformers 5's name of the tied head's rescale
    hub['tie_word_embeddings'] = False  # as the hub's MADLAD-400 config.json says it
    (staging / 'config.json').write_text(json.dumps(hub, indent=2))
    shards = [p.name for p in staging.glob('*.safetensors')]
    return {'parameters': sum(p.numel() for p in model.parameters()), 'shards': len(shards)}


def hf_dir_of(args, directory: str, layers: int, work: pathlib.Path, name: str, spiece=None):
    """Builds ``directory`` at ``layers`` (in a child ``name``: its time and peak RSS) or
    checks that the one there has the sizes asked for."""
    if not os.path.isfile(f'{directory}/config.json'):
        if os.path.isdir(directory) and os.listdir(directory):
            raise SystemExit(f't5_speed.py: {directory} has no config.json: name another.')
        kwargs = dict(data=args.data, shape=shape_of(args, layers), spiece=spiece)
        kwargs.update(spm_pieces=args.spm_pieces, shard_size=args.shard_size)
        return measured.run_child('t5_speed', name, dict(kwargs, directory=directory), work)
    config = json.loads(pathlib.Path(directory, 'config.json').read_text())
    asked = {'d_model': args.d_model, 'd_ff': args.d_ff, 'num_layers': layers}
    asked['vocab_size'] = args.vocab
    found = {key: config.get(key) for key in asked}
    if found != asked:
        raise SystemExit(f't5_speed.py: {directory} has {found}, not {asked}: remove it.')
    return {'measurement': name, 'reused': directory}


def decode_hf(hf_dir, source, result, threads, beam_size, batch_size, extra_length) -> None:
    """T5ForConditionalGeneration.generate on ``source``'s lines, each ``'<2de> ' + line``;
    writes the outputs and times to ``result``."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    start = time.perf_counter()
    tokenizer = transformers.T5Tokenizer.from_pretrained(hf_dir)
    model = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).eval()
    loaded = time.perf_counter()
    lines = [f'{TAG} {line}' for line in read(source)]  # (the tag counts in the limit)
    hypotheses, tokens = measured.generate(
        tokenizer, model, lines, beam_size, batch_size, extra_length
    )
    times = dict(load_s=loaded - start, decode_s=time.perf_counter() - loaded)
    measured.write_json(result, dict(times, output_tokens=tokens, hypotheses=hypotheses))


def decode_ct2(ct2_dir, source, result, threads, beam_size, batch_size, extra_length) -> None:
    """Translator.translate_batch of our CTranslate2 export on ``source``'s lines, each
    ``['<2de>', ..., '</s>']``; as `decode_hf`."""
    import ctranslate2
    import sentencepiece as spm

    start = time.perf_counter()
    translator = ctranslate2.Translator(ct2_dir, 'cpu', inter_threads=1, intra_threads=threads)
    sp = spm.SentencePieceProcessor(model_file=f'{ct2_dir}/{SPM_FILE}')
    loaded = time.perf_counter()
    lines = read(source)
    pieces = [[TAG, *sp.encode(line, out_type=str), '</s>'] for line in lines]
    hypotheses, tokens = [''] * len(lines), 0
    for batch in batches([len(p) for p in pieces], batch_size):
        results = translator.translate_batch(
            [pieces[i] for i in batch], beam_size=beam_size, max_batch_size=batch_size,
            max_decoding_length=max(len(pieces[i]) for i in batch) + extra_length,
            return_end_token=True,
        )  # fmt: skip
        for i, r in zip(batch, results, strict=True):
            tokens += len(r.hypotheses[0])
            text = [p for p in r.hypotheses[0] if sp.piece_to_id(p) > 2]  # no specials, sentinels
            hypotheses[i] = sp.decode_pieces(text)
    times = dict(load_s=loaded - start, decode_s=time.perf_counter() - loaded)
    measured.write_json(result, dict(times, output_tokens=tokens, hypotheses=hypotheses))


CHILDREN = {
    'build_hf_dir': build_hf_dir,
    'build_hf_dir_small': build_hf_dir,
    'decode_hf': decode_hf,
    'decode_ct2': decode_ct2,
}


def projection(args, small: dict, full: dict) -> dict:
    """Convert's peak RSS and time at --project_layers from its ``small`` and ``full``
    measurements, linear in the layers (module docstring)."""
    layers = (args.small_layers, args.layers, args.project_layers)
    sizes = {
        n: sum(4 * math.prod(s) for s in convert_memory.tensor_shapes(**shape_of(args, n)).values())
        / MIB
        for n in layers
    }
    out = {'method': 'linear in the layers per stack, from convert at the two sizes measured'}
    out['layers'] = dict(zip(('small', 'measured', 'projected'), layers, strict=True))
    out['model_float32_mib'] = {str(n): sizes[n] for n in layers}
    for key in ('peak_rss_mib', 'command_s'):
        per_layer = (full[key] - small[key]) / (args.layers - args.small_layers)
        fixed = full[key] - args.layers * per_layer
        projected = fixed + args.project_layers * per_layer
        out[key] = dict(fixed=fixed, per_layer=per_layer, projected=projected)
    out['projected_peak_over_model'] = out['peak_rss_mib']['projected'] / sizes[layers[2]]
    return out


def read_through(directory: str) -> None:
    """Reads every file of ``directory`` once, so that a conversion timed next reads them from
    the page cache: without it the 2 + 2 directory, read cold, converted slower than the
    4 + 4 one read warm, and the time's slope came out negative."""
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), 'rb') as f:
            while f.read(64 * MIB):
                pass


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    load_before = os.getloadavg()[0]  # other jobs on the machine make the timings noisy
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.hf_dir = os.path.abspath(args.hf_dir or work / 'hf')
    small_dir = str(work / f'hf_{args.small_layers}')
    results = [hf_dir_of(args, args.hf_dir, args.layers, work, 'build_hf_dir')]
    spiece = f'{args.hf_dir}/{SPM_FILE}'
    results.append(
        hf_dir_of(args, small_dir, args.small_layers, work, 'build_hf_dir_small', spiece)
    )
    for result in results:
        print(json.dumps(result), flush=True)
    write(work / 'source.en', read(f'{args.data}/test2016.en')[: args.sentences])
    write(work / 'reference.de', read(f'{args.data}/test2016.de')[: args.sentences])
    measured.clear_previous(work, MADE, MARK)
    converts = {}
    for directory in (small_dir, args.hf_dir):
        read_through(directory)
    for name, directory, run in (
        ('convert_small', small_dir, 'run_small'),
        ('convert_ours', args.hf_dir, 'run'),
    ):
        command = [sys.executable, '-m', 'transformer.convert', '--from_hf', directory]
        converts[name] = measure(name, [*command, '--workdir', str(work / run)], work)
        MARK.write(str(work / run))
        results.append(converts[name])
        print(json.dumps(results[-1]), flush=True)
    projected = projection(args, converts['convert_small'], converts['convert_ours'])
    print(json.dumps({'projection': projected}), flush=True)
    fairseq_speed.decode_and_report(args, work, results, T5, load_before, projection=projected)


if __name__ == '__main__':
    main()
