"""Peak host memory of converting a sharded T5 v1.1 directory, against the model's float32 size.

The directory is written here without a transformers model in memory: random float32 tensors
under T5ForConditionalGeneration's names (shared, lm_head, the blocks, the relative position
tables), one shard at a time (``--shards`` files listed by model.safetensors.index.json),
config.json (gated-gelu, untied head) and a SentencePiece model trained on a few words whose
pieces are padded with fillers to ``--vocab`` - 100 (T5's 100 sentinels make up the rest).
``python -m transformer.convert --from_hf DIR --workdir W`` then runs in a process of its own
(benchmarks/measured.py: its peak RSS from wait4), and so does ``convert --help``, which is
what the interpreter and the imports cost before any tensor is read. Figures: benchmarks/README.md.

    python benchmarks/convert_memory.py --out /tmp/convert_memory.json   # d_model 512, 4 + 4
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.measured import measure  # noqa: E402 (after the path above)

MIB = 2**20
SENTINELS = 100


def tensor_shapes(d: int, heads: int, d_kv: int, d_ff: int, layers: int, vocab: int, buckets=32):
    """{name: shape} of a T5 v1.1 state dict (torch's [out, in]), as the hub stores it."""
    inner = heads * d_kv
    shapes = {'shared.weight': (vocab, d), 'lm_head.weight': (vocab, d)}
    attentions = {'encoder': ('SelfAttention',), 'decoder': ('SelfAttention', 'EncDecAttention')}
    ffn = {'wi_0': (d_ff, d), 'wi_1': (d_ff, d), 'wo': (d, d_ff)}
    for stack, sublayers in attentions.items():
        shapes[f'{stack}.final_layer_norm.weight'] = (d,)
        table = f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight'
        shapes[table] = (buckets, heads)
        for i in range(layers):
            for j, name in enumerate((*sublayers, 'DenseReluDense')):
                prefix = f'{stack}.block.{i}.layer.{j}'
                shapes[f'{prefix}.layer_norm.weight'] = (d,)
                if name == 'DenseReluDense':
                    for proj, shape in ffn.items():
                        shapes[f'{prefix}.{name}.{proj}.weight'] = shape
                else:
                    for proj in 'qkv':
                        shapes[f'{prefix}.{name}.{proj}.weight'] = (inner, d)
                    shapes[f'{prefix}.{name}.o.weight'] = (d, inner)
    return shapes


def write_spiece(directory: pathlib.Path, pieces: int) -> None:
    """spiece.model: T5's ids (pad 0, eos 1, unk 2), a few trained pieces, fillers up to
    ``pieces``."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    text = directory / 'train.txt'
    text.write_text('the house is small\nder Hund ist gross\nein Mann im Park\n' * 20)
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(directory / 'spiece'), vocab_size=24,
        model_type='unigram', pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((directory / 'spiece.model').read_bytes())
    for n in range(pieces - len(proto.pieces)):
        proto.pieces.add(piece=f'▁fill{n:05d}', score=-100.0 - n)
    (directory / 'spiece.model').write_bytes(proto.SerializeToString())
    for name in ('train.txt', 'spiece.vocab'):
        (directory / name).unlink()


def write_model(directory: pathlib.Path, shape: dict, shards: int) -> int:
    """A T5 v1.1 directory of ``shape`` in ``shards`` safetensors shards; its float32 bytes."""
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir(parents=True)
    write_spiece(directory, shape['vocab'] - SENTINELS)
    shapes = tensor_shapes(**shape)
    config = {
        'architectures': ['T5ForConditionalGeneration'], 'model_type': 't5',
        'd_model': shape['d'], 'num_heads': shape['heads'], 'd_kv': shape['d_kv'],
        'd_ff': shape['d_ff'], 'num_layers': shape['layers'],
        'num_decoder_layers': shape['layers'], 'vocab_size': shape['vocab'],
        'feed_forward_proj': 'gated-gelu', 'tie_word_embeddings': False,
        'relative_attention_num_buckets': 32, 'relative_attention_max_distance': 128,
        'layer_norm_epsilon': 1e-6, 'pad_token_id': 0, 'eos_token_id': 1,
        'decoder_start_token_id': 0, 'dropout_rate': 0.0,
    }  # fmt: skip
    (directory / 'config.json').write_text(json.dumps(config, indent=2))
    rng, names = np.random.default_rng(0), list(shapes)
    weight_map = {}
    for n in range(shards):
        file = f'model-{n + 1:05d}-of-{shards:05d}.safetensors'
        part = {k: rng.standard_normal(shapes[k], np.float32) for k in names[n::shards]}
        save_file(part, str(directory / file), metadata={'format': 'pt'})
        weight_map |= dict.fromkeys(part, file)
        del part
    index = {'metadata': {}, 'weight_map': weight_map}
    (directory / 'model.safetensors.index.json').write_text(json.dumps(index, indent=2))
    return sum(4 * int(np.prod(s)) for s in shapes.values())


def run(work: pathlib.Path, shape: dict, shards: int) -> dict:
    """Writes the directory under ``work`` (emptied first), converts it; the figures."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    python = sys.executable
    # Written in a process of its own: a child's peak RSS starts at this process's RSS.
    script = 'import json, pathlib, sys; from benchmarks import convert_memory as m; '
    script += 'm.write_model(pathlib.Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]))'
    written = [python, '-c', script, str(work / 'hf'), json.dumps(shape), str(shards)]
    subprocess.run(written, cwd=REPO, check=True)
    model_bytes = sum(4 * math.prod(s) for s in tensor_shapes(**shape).values())
    command = [python, '-m', 'transformer.convert']
    base = measure('import_only', [*command, '--help'], work)
    command += ['--from_hf', str(work / 'hf'), '--workdir', str(work / 'run')]
    convert = measure('convert', command, work)
    model_mib = model_bytes / MIB
    return {
        'shape': shape,
        'shards': shards,
        'model_float32_mib': model_mib,
        'import_only_peak_rss_mib': base['peak_rss_mib'],
        'convert_peak_rss_mib': convert['peak_rss_mib'],
        'convert_s': convert['command_s'],
        'peak_over_model': convert['peak_rss_mib'] / model_mib,
        'peak_less_import_over_model': (convert['peak_rss_mib'] - base['peak_rss_mib']) / model_mib,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (('d_model', 512), ('heads', 8), ('d_kv', 64), ('d_ff', 2048)):
        parser.add_argument(f'--{name}', type=int, default=default)
    parser.add_argument('--layers', type=int, default=4, help='encoder and decoder layers each')
    parser.add_argument('--vocab', type=int, default=32128)
    parser.add_argument('--shards', type=int, default=3)
    parser.add_argument('--work', type=pathlib.Path, default=pathlib.Path('/tmp/convert_memory'))
    parser.add_argument('--out', type=pathlib.Path)
    args = parser.parse_args(argv)
    shape = dict(d=args.d_model, heads=args.heads, d_kv=args.d_kv, d_ff=args.d_ff)
    shape |= dict(layers=args.layers, vocab=args.vocab)
    result = run(args.work, shape, args.shards)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == '__main__':
    main()
