"""Time of the label-smoothed loss and its gradient over a Multi30k step's logits.

    .venv/bin/python benchmarks/loss_speed.py            # 64 x 32 positions, V 8000
    .venv/bin/python benchmarks/loss_speed.py --train_step 12   # + whole training steps

Compares `steps.cross_entropy_with_smoothing` (its gradient written out, one pass over the
logits) with the same loss written through ``jax.nn.log_softmax`` and differentiated by
autodiff, on the same random logits: value and gradient of the summed smoothed loss, jitted,
best of ``--repeats``. Prints both and the ratio; saves JSON. ``--train_step N`` also times
`configs/multi30k.py`'s real training step (dropout 0.1, rbg) compiled with each loss, N
interleaved rounds, and reports the median per-round ratio. ``--chunks 512 1024`` also times
the output layer and loss together from hidden states [B, T, ``--d_model``] and the tied
embedding, with the full logits and with `loss.fused_cross_entropy` in chunks of those many
tokens (``train.loss_chunk_tokens``): value and gradients, XLA's temporaries, the median of
``--repeats`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks.step_overhead import full_step  # noqa: E402
from transformer import configs  # noqa: E402
from transformer.backends import logits_layout  # noqa: E402
from transformer.training import cross_entropy_with_smoothing, fused_cross_entropy  # noqa: E402

# `train_step_ratio` swaps the step's loss for the autodiff one while a step compiles.
from transformer.training import steps as step_module  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def autodiff_sums(logits, targets, weights, eps):
    """The same (smoothed sum, NLL sum) through log_softmax, differentiated by autodiff: a
    drop-in for `steps.cross_entropy_with_smoothing`."""
    vocab = logits.shape[-1]
    low = eps / (vocab - 1)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    target = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    smoothed = -(1.0 - eps - low) * target - low * log_probs.sum(axis=-1)
    return (smoothed * weights).sum(), (-target * weights).sum()


def train_step_ratio(rounds: int) -> dict:
    """Median per-round time of the training step with each loss, interleaved."""
    config = configs.load('multi30k')
    runs = {'ours': full_step(config, 0.1, 'rbg')}
    step_module.cross_entropy_with_smoothing = autodiff_sums  # only while this step compiles
    try:
        runs['autodiff'] = full_step(config, 0.1, 'rbg')
    finally:
        step_module.cross_entropy_with_smoothing = cross_entropy_with_smoothing
    for run in runs.values():
        run(), run()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    ratio = statistics.median(a / b for a, b in zip(times['ours'], times['autodiff'], strict=True))
    report = {f'{name}_median_ms': 1e3 * statistics.median(t) for name, t in times.items()}
    print(
        f'training step: ours {report["ours_median_ms"]:.0f} ms, autodiff loss '
        f'{report["autodiff_median_ms"]:.0f} ms, ratio x{ratio:.3f} (median of {rounds} rounds)'
    )
    return {**report, 'ratio': ratio}


def chunked_loss(args, targets, weights) -> dict:
    """The loss head, full logits (chunk 0) against chunks: temp MiB and median ms."""
    rng = np.random.default_rng(1)
    dtype = jnp.dtype(args.dtype)
    hidden = jnp.asarray(rng.standard_normal((*targets.shape, args.d_model)), dtype)
    table = rng.standard_normal((args.vocab_size, args.d_model)) / np.sqrt(args.d_model)
    table = jnp.asarray(table, jnp.float32)

    def full(y, e):
        logits = logits_layout.tied_logits(y, e.astype(dtype)).astype(jnp.float32)
        return cross_entropy_with_smoothing(logits, targets, weights, 0.1)[0]

    def chunked(size):
        return lambda y, e: fused_cross_entropy(y, e, None, targets, weights, 0.1, size, dtype)[0]

    heads = {0: full} | {size: chunked(size) for size in args.chunks}
    compiled = {
        size: jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(hidden, table).compile()
        for size, fn in heads.items()
    }
    times = {size: [] for size in compiled}
    for fn in compiled.values():
        jax.block_until_ready(fn(hidden, table))
    for _ in range(args.repeats):
        for size, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(hidden, table))
            times[size].append(time.perf_counter() - start)
    report = {}
    for size, fn in compiled.items():
        temp = fn.memory_analysis().temp_size_in_bytes / 2**20
        report[str(size)] = {'temp_mib': temp, 'median_ms': 1e3 * statistics.median(times[size])}
        print(f'loss head, chunk {size or "none (full logits)"}: {temp:.1f} MiB of temporaries, '
              f'{report[str(size)]["median_ms"]:.0f} ms (median of {args.repeats})')  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch_size', type=int, default=64)
    parser.add_argument('--length', type=int, default=32)
    parser.add_argument('--vocab_size', type=int, default=8000)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--train_step', type=int, default=0, help='N > 0: N rounds of steps')
    parser.add_argument('--chunks', type=int, nargs='*', default=[], help='chunked-loss sizes')
    parser.add_argument('--d_model', type=int, default=256, help='hidden width for --chunks')
    parser.add_argument('--dtype', default='float32', help='compute dtype for --chunks')
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/loss_speed.json'))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.length)
    logits = jnp.asarray(rng.standard_normal((*shape, args.vocab_size)), jnp.float32)
    targets = jnp.asarray(rng.integers(1, args.vocab_size, shape), jnp.int32)
    weights = jnp.ones(shape, jnp.float32)
    losses = {
        'autodiff': lambda *a: autodiff_sums(*a)[0],
        'ours': lambda *a: cross_entropy_with_smoothing(*a)[0],
    }
    results = {}
    for name, loss in losses.items():
        fn = jax.jit(jax.value_and_grad(loss), static_argnums=3)
        (value, _), times = common.best_time(
            lambda fn=fn: fn(logits, targets, weights, 0.1), args.repeats
        )
        results[name] = {'best_ms': 1e3 * times['best_s'], 'loss': float(value)}
        print(f'{name:>9}: {results[name]["best_ms"]:7.1f} ms, loss {float(value):.6f}')
    ratio = results['ours']['best_ms'] / results['autodiff']['best_ms']
    print(f'ours / autodiff: {ratio:.2f}')
    if args.train_step:
        results['train_step'] = train_step_ratio(args.train_step)
    if args.chunks:
        results['chunked_loss'] = chunked_loss(args, targets, weights)
    settings = {k: v for k, v in vars(args).items() if k != 'out'}
    report = {'settings': settings, 'results': results, 'ratio': ratio}
    common.write_report(args.out, report | common.host())


if __name__ == '__main__':
    main()
