"""Decoding speed: sentences per second of greedy and beam search, random parameters.

The defaults are the Multi30k model (configs/multi30k.py: d_model 256, 4 heads, d_ff 1024,
3 + 3 layers, 8000 tokens) on 64 sources of 16 to 32 tokens (24 on average), beam 4 and
alpha 0.6 (Sec. 6.1). Both searches run exactly ``--max_decode_len`` steps: a random model
almost never picks EOS, so greedy runs to the limit, and beam search runs without early
stopping, which would end it after a step or two (a random model's best output is EOS alone)
where a trained model's would run to about its output length. Each search is compiled and
run once, then timed over ``--repeats`` runs (the best is reported). Checksums of the output
tokens (every beam's) tell whether two runs decoded the same thing. Prints the figures and
saves them as JSON.

    .venv/bin/python benchmarks/decode_speed.py
    .venv/bin/python benchmarks/decode_speed.py --batch_size 16 --beam_size 8
    .venv/bin/python benchmarks/decode_speed.py --ensemble 2   # two models decoded together
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402
from transformer import decoding  # noqa: E402
from transformer.model import Transformer, TransformerConfig, init_params  # noqa: E402
from transformer.tokens import EOS_ID, PAD_ID  # noqa: E402


def add_size_flags(parser: argparse.ArgumentParser, repeats: int) -> None:
    """The model, batch and search sizes (the Multi30k model's by default) and the timed
    rounds: the flags every decoding benchmark shares."""
    parser.add_argument('--vocab_size', type=int, default=8000)
    parser.add_argument('--d_model', type=int, default=256)
    parser.add_argument('--num_heads', type=int, default=4)
    parser.add_argument('--d_ff', type=int, default=1024)
    parser.add_argument('--num_layers', type=int, default=3, help='encoder and decoder each')
    parser.add_argument('--batch_size', type=int, default=64, help='source sentences')
    parser.add_argument('--min_length', type=int, default=16, help='source tokens, EOS included')
    parser.add_argument('--max_length', type=int, default=32, help='also the padded width S')
    parser.add_argument('--beam_size', type=int, default=4)
    parser.add_argument('--alpha', type=float, default=0.6)
    parser.add_argument('--max_decode_len', type=int, default=32, help='decoding steps T')
    parser.add_argument('--repeats', type=int, default=repeats)
    parser.add_argument('--seed', type=int, default=0)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser, repeats=3)
    parser.add_argument(
        '--ensemble', type=int, default=1, help='M > 1: M random models decoded together'
    )
    parser.add_argument('--out', default=str(REPO / 'benchmarks' / 'results' / 'decode_speed.json'))
    return parser.parse_args(argv)


def random_sources(args: argparse.Namespace) -> np.ndarray:
    """[B, S] right-padded random sources ending in EOS."""
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(2, args.vocab_size, (args.batch_size, args.max_length), np.int32)
    lengths = rng.integers(args.min_length, args.max_length + 1, args.batch_size)
    positions = np.arange(args.max_length)[None, :]
    tokens[positions == lengths[:, None] - 1] = EOS_ID
    tokens[positions >= lengths[:, None]] = PAD_ID
    return tokens


def save_report(args: argparse.Namespace, fields: dict) -> None:
    """Writes the settings (``args`` but ``out``), the machine and ``fields`` as JSON to
    ``args.out``: the report of every decoding benchmark."""
    settings = {k: v for k, v in vars(args).items() if k != 'out'}
    common.write_report(args.out, {'settings': settings} | common.host() | fields)


def _checksum(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, np.int32).tobytes()).hexdigest()[:16]


def _timed(fn, repeats: int) -> tuple[np.ndarray, dict[str, float]]:
    """``fn``'s output and its compile + first run time and best time over ``repeats``."""
    out, times = common.best_time(fn, repeats)
    return np.asarray(out), times


def model_config(args: argparse.Namespace, **overrides) -> TransformerConfig:
    """The benchmarked model's config from the size flags (no dropout)."""
    return TransformerConfig(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        num_heads=args.num_heads,
        d_ff=args.d_ff,
        num_encoder_layers=args.num_layers,
        num_decoder_layers=args.num_layers,
        dropout_rate=0.0,
        **{'attention_impl': 'einsum', **overrides},  # the path the figures were measured on
    )


def _output_lengths(tokens: np.ndarray) -> np.ndarray:
    is_eos = tokens == EOS_ID
    return np.where(is_eos.any(-1), is_eos.argmax(-1) + 1, tokens.shape[-1])


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    model = Transformer(model_config(args))
    inputs = random_sources(args)
    init = jax.jit(lambda rng: init_params(model, rng, inputs.shape[1]))
    members = [init(jax.random.key(args.seed + m)) for m in range(args.ensemble)]
    ensemble = args.ensemble > 1
    params = decoding.ensemble_params(members) if ensemble else members[0]
    searches = {
        'greedy': lambda: decoding.greedy_search(
            model,
            params,
            inputs,
            options=decoding.DecodeOptions(max_decode_len=args.max_decode_len),
        ),
        f'beam_{args.beam_size}': lambda: decoding.beam_search(
            model,
            params,
            inputs,
            beam_size=args.beam_size,
            options=decoding.DecodeOptions(max_decode_len=args.max_decode_len, alpha=args.alpha),
            early_stop=False,
        )[0],
    }
    results = {}
    for name, search in searches.items():
        tokens, times = _timed(search, args.repeats)
        best = tokens if tokens.ndim == 2 else tokens[:, 0]  # [B, T] or [B, K, T]
        results[name] = {
            'sentences_per_s': args.batch_size / times['best_s'],
            **times,
            'mean_output_tokens': float(_output_lengths(best).mean()),
            'tokens_checksum': _checksum(tokens),
        }
        print(
            f'{name:>8}: {results[name]["sentences_per_s"]:8.1f} sentences/s '
            f'(best {times["best_s"]:.3f} s, first call {times["first_call_s"]:.1f} s, '
            f'{results[name]["mean_output_tokens"]:.1f} output tokens, '
            f'checksum {results[name]["tokens_checksum"]})'
        )
    save_report(
        args,
        {'mean_source_tokens': float((inputs != PAD_ID).sum(-1).mean()), 'results': results},
    )


if __name__ == '__main__':
    main()
