r"""Decoding speed beside flax examples/wmt: beam 4 and greedy, same sizes, same sentences.

  FLAX_WMT_DIR=<checkout of google/flax>/examples/wmt python benchmarks/decode_peers.py

flax-wmt's ``models.py`` and ``decode.py`` are loaded at run time from ``$FLAX_WMT_DIR``
(never copied here) and run as its ``train.predict_step`` does: encode, expand to the beam,
``decoding.beam_search`` over its cache. Greedy there is its beam search with beam 1. Both
models have random parameters of the same sizes (the Multi30k model by default: d 256,
4 heads, d_ff 1024, 3 + 3 layers, 8000 tokens; flax-wmt is pre-LN, ours post-LN: the same
matmuls) and decode the same 64 sources. To time the same number of steps, both run exactly
``max_decode_len`` positions: flax-wmt is given an end-of-sentence id that never occurs,
ours runs without early stopping. The searches are compiled, then timed interleaved
(ours, theirs, ours, theirs ...); the median per-round ratio is reported with the best times.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import linen as nn  # noqa: E402

from benchmarks.decode_speed import (  # noqa: E402
    add_size_flags,
    model_config,
    random_sources,
    save_report,
)
from transformer import decoding
from transformer.model import Transformer  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load(directory: str, name: str):
    spec = importlib.util.spec_from_file_location(f'flax_wmt_{name}', f'{directory}/{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flax_wmt_dir() -> str:
    """``$FLAX_WMT_DIR``, checked before anything is built: a one-line exit where it is unset
    or lacks the two files this script loads."""
    directory = os.environ.get('FLAX_WMT_DIR')
    if not directory:
        raise SystemExit(
            'decode_peers.py: set FLAX_WMT_DIR to the examples/wmt folder of a google/flax '
            'checkout.'
        )
    missing = [f for f in ('models.py', 'decode.py') if not os.path.isfile(f'{directory}/{f}')]
    if missing:
        raise SystemExit(
            f'decode_peers.py: FLAX_WMT_DIR={directory} has no {" or ".join(missing)}; '
            'point it at the examples/wmt folder of a google/flax checkout.'
        )
    return directory


def flax_wmt_search(directory: str, args, inputs, beam_size: int):
    """A jitted () -> [B, beam, T] of flax-wmt's beam search, as its predict_step runs it;
    ``directory`` holds flax-wmt's files (`flax_wmt_dir`)."""
    models, wmt_decode = _load(directory, 'models'), _load(directory, 'decode')
    cfg = models.TransformerConfig(
        vocab_size=args.vocab_size,
        output_vocab_size=args.vocab_size,
        share_embeddings=True,
        logits_via_embedding=True,
        emb_dim=args.d_model,
        num_heads=args.num_heads,
        num_layers=args.num_layers,
        qkv_dim=args.d_model,
        mlp_dim=args.d_ff,
        max_len=max(args.max_length, args.max_decode_len),
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        deterministic=True,
    )
    predict = cfg.replace(decode=True)
    params = jax.jit(models.Transformer(cfg).init)(jax.random.key(0), inputs, inputs)['params']
    # As its train.initialize_cache: per sentence; beam_search expands it to the beams.
    cache = jax.jit(models.Transformer(predict).init)(
        jax.random.key(0), jnp.ones(inputs.shape), jnp.ones((len(inputs), args.max_decode_len))
    )['cache']

    @jax.jit
    def search(params, cache, inputs):
        encoded = wmt_decode.flat_batch_beam_expand(
            models.Transformer(predict).apply(
                {'params': params}, inputs, method=models.Transformer.encode
            ),
            beam_size,
        )
        raw_inputs = wmt_decode.flat_batch_beam_expand(inputs, beam_size)

        def tokens_ids_to_logits(flat_ids, flat_cache):
            logits, new_vars = models.Transformer(predict).apply(
                {'params': params, 'cache': flat_cache},
                encoded,
                raw_inputs,
                flat_ids,
                mutable=['cache'],
                method=models.Transformer.decode,
            )
            return logits.squeeze(axis=1), new_vars['cache']

        seqs, _ = wmt_decode.beam_search(
            inputs,
            cache,
            tokens_ids_to_logits,
            beam_size=beam_size,
            alpha=args.alpha,
            eos_id=-1,  # never produced: every search runs max_decode_len steps
            max_decode_len=args.max_decode_len,
        )
        return seqs

    return lambda: search(params, cache, inputs)


def ours_search(args, inputs, beam_size: int):
    model = Transformer(model_config(args, attention_impl=args.attention_impl))
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), inputs[:1], inputs[:1])['params'])
    if beam_size == 1:
        return lambda: decoding.greedy_search(
            model,
            params,
            inputs,
            options=decoding.DecodeOptions(max_decode_len=args.max_decode_len),
        )
    return lambda: decoding.beam_search(
        model,
        params,
        inputs,
        beam_size=beam_size,
        options=decoding.DecodeOptions(max_decode_len=args.max_decode_len, alpha=args.alpha),
        early_stop=False,
    )[0]


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser, repeats=5)
    parser.add_argument('--attention_impl', default='einsum', choices=('einsum', 'fused'))
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/decode_peers.json'))
    args = parser.parse_args(argv)
    directory = flax_wmt_dir()
    inputs = random_sources(args)
    results = {}
    for beam in (args.beam_size, 1):
        label = 'greedy' if beam == 1 else f'beam_{beam}'
        fns = {
            'ours': ours_search(args, inputs, beam),
            'flaxwmt': flax_wmt_search(directory, args, inputs, beam),
        }
        first = {}
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            first[name] = time.perf_counter() - start
        times = {name: [] for name in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                jax.block_until_ready(fn())
                times[name].append(time.perf_counter() - start)
        speedup = statistics.median(
            t / o for o, t in zip(times['ours'], times['flaxwmt'], strict=True)
        )
        results[label] = {
            name: {
                'sentences_per_s': args.batch_size / min(times[name]),
                'best_s': min(times[name]),
                'first_call_s': first[name],
            }
            for name in fns
        } | {'ours_speedup_median': speedup}
        print(
            f'{label:>7}: ours {results[label]["ours"]["sentences_per_s"]:7.1f} sentences/s, '
            f'flax-wmt {results[label]["flaxwmt"]["sentences_per_s"]:7.1f}; '
            f'ours is {speedup:.2f}x faster (median of {args.repeats} interleaved rounds)'
        )
    save_report(args, {'results': results})


if __name__ == '__main__':
    main()
