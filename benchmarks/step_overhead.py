r"""The full training step against the bare model step, interleaved in one process.

  python benchmarks/step_overhead.py --preset multi30k

Times, on the same token count, (1) peers.py's model step (random 64 x 32 batch, dropout 0,
plain mean cross-entropy, optax.adam) and the package's real `steps.train_step` on packed
32 x 64 rows (segment masks, label-smoothed sums, metrics, the paper's schedule) with
(2) dropout 0, (3) dropout 0.1 drawn by threefry (the default), (4) by rbg, (5) by
unsafe_rbg and (6) by philox4x32, all with the package's 16-bit keep masks
(transformer/model/dropout.py), and (7) rbg with flax's nn.Dropout (a 32-bit uniform per element)
swapped in while that step compiles. Run interleaved (1 2 3 ... 7 1 2 ...) after compilation;
prints the median ms and the median per-round ratio to (1), which is robust to the host's
load.
"""

import argparse
import contextlib
import dataclasses
import functools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks.train_speed import random_packed_batches  # noqa: E402
from transformer import configs, training  # noqa: E402
from transformer.model import Transformer, config_from_dict  # noqa: E402


def model_step(cfg, batch, length):
    """peers.py's step: dropout 0, one-hot smoothed cross-entropy mean, optax.adam."""
    model = Transformer(dataclasses.replace(cfg, dropout_rate=0.0))
    rng = np.random.default_rng(0)
    src, tgt = (rng.integers(3, cfg.vocab_size, (batch, length)).astype(np.int32) for _ in '12')
    params = jax.jit(model.init)(jax.random.key(0), src, tgt)['params']
    tx = optax.adam(1e-4)

    def loss_fn(p, s, t):
        logits = model.apply({'params': p}, s, t)
        labels = optax.smooth_labels(jax.nn.one_hot(t, cfg.vocab_size), 0.1)
        w = (t > 0).astype(jnp.float32)
        return jnp.sum(optax.softmax_cross_entropy(logits, labels) * w) / jnp.sum(w)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, s, t):
        p, o = state
        loss, g = jax.value_and_grad(loss_fn)(p, s, t)
        upd, o = tx.update(g, o, p)
        return (optax.apply_updates(p, upd), o), loss

    state = [(params, tx.init(params))]

    def run():
        state[0], loss = step(state[0], src, tgt)
        jax.block_until_ready(loss)

    return run


@contextlib.contextmanager
def flax_dropout():
    """The model built with flax's nn.Dropout in place of transformer.dropout.Dropout."""
    from flax import linen as nn

    from transformer.model import attention, layers
    from transformer.model import transformer as model_lib

    modules = (attention, layers, model_lib)
    saved = [m.Dropout for m in modules]
    for m in modules:
        m.Dropout = nn.Dropout
    try:
        yield
    finally:
        for m, d in zip(modules, saved, strict=True):
            m.Dropout = d


def full_step(config, dropout, prng, masks='16-bit'):
    config = config.copy_and_resolve_references()
    config.model.dropout_rate = dropout
    model = Transformer(config_from_dict(config.model, config.data.vocab_size))
    tx, schedule = training.make_optimizer(config.opt, config.model.d_model)
    step = jax.jit(
        functools.partial(
            training.train_step,
            model=model,
            tx=tx,
            schedule=schedule,
            label_smoothing=config.train.label_smoothing,
            accum_steps=1,
        ),
        donate_argnums=0,
    )
    state = [training.init_state(model, tx, jax.random.key(0), config.data.max_len)]
    batch = next(
        random_packed_batches(config.train.batch_size, config.data.max_len, config.data.vocab_size)
    )
    rng = training.dropout_key(0, prng)

    def run():
        state[0], sums = step(state[0], batch, rng)
        jax.block_until_ready(sums)

    with flax_dropout() if masks == 'flax' else contextlib.nullcontext():
        run()  # traces and compiles the step with the chosen dropout module
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=10)
    args = parser.parse_args()
    config = configs.load('multi30k')
    cfg = config_from_dict(config.model, config.data.vocab_size)
    tokens = config.train.batch_size * config.data.max_len
    runs = {
        'model step (peers.py)': model_step(cfg, tokens // 32, 32),
        'train_step dropout 0': full_step(config, 0.0, 'rbg'),
        'train_step 0.1 threefry': full_step(config, 0.1, 'threefry'),
        'train_step 0.1 rbg': full_step(config, 0.1, 'rbg'),
        'train_step 0.1 unsafe_rbg': full_step(config, 0.1, 'unsafe_rbg'),
        'train_step 0.1 philox4x32': full_step(config, 0.1, 'philox4x32'),
        'train_step 0.1 rbg, flax nn.Dropout': full_step(config, 0.1, 'rbg', masks='flax'),
    }
    for run in runs.values():
        run(), run()
    times = {name: [] for name in runs}
    load = os.getloadavg()[0]
    for _ in range(args.steps):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = times['model step (peers.py)']
    print(f'load average {load:.1f} -> {os.getloadavg()[0]:.1f}, {tokens} target tokens/step')
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, base, strict=True))
        print(f'{name:36} {statistics.median(t) * 1e3:8.0f} ms  x{ratio:.3f} of the model step')


if __name__ == '__main__':
    main()
