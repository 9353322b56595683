r"""Training throughput of a config: steps/s, tokens/s, FLOPs, MFU, peak memory.

  python benchmarks/train_speed.py --config configs/multi30k.py \
      --config.data.manual_dir=../shared/data/multi30k --steps 30     # real packed batches
  python benchmarks/train_speed.py --config configs/base.py --config.model.dtype=bfloat16
                                    # GPU: random batches of the config's shape, no TensorFlow

Runs the real train step (the config's parallelism mode over all local devices, dropout and
its PRNG as configured) after a few untimed steps that compile it. ``--data=real`` reads the
config's dataset through the training command's own set-up; ``--data=random`` builds packed
rows of random tokens of the config's shape (batch_size x data.max_len, ~4 segments a row,
~8% padding) and needs only jax/flax/optax/numpy; ``auto`` (default) is real when the data is
local (a ``manual_dir``/``folder`` is given, or the built-in synthetic task), else random.

Reports analytic matmul FLOPs per step (transformer/model/flops.py), achieved FLOP/s, MFU against
the accelerator's data-sheet peak for the compute dtype or, on CPU, a measured jitted matmul,
peak memory, the bytes of temporaries XLA's memory analysis gives the compiled step
(``temp_bytes``), the seconds lowering and compiling it took (``compile_s``), and the
projected wall time of ``train.num_steps`` (the paper's 100k steps for configs/base.py).
Saves a JSON in results/. ``--profile_steps N`` then traces N more steps with `jax.profiler`
(benchmarks/gpu_check.py reads the trace).
"""

import json
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from benchmarks import common  # noqa: E402
from transformer import training  # noqa: E402
from transformer.backends import host_memory
from transformer.commands import console  # noqa: E402
from transformer.model import peak_flops, train_flops  # noqa: E402
from transformer.schema import ConfigError  # noqa: E402

host_memory.configure()  # as every command does, before jax's first computation

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Only when run as a script: tests import `random_packed_batches` from this module."""
    config_flags.DEFINE_config_file('config', None, 'Experiment config.', lock_config=True)
    flags.DEFINE_integer('steps', 30, 'Timed steps.', lower_bound=1)
    flags.DEFINE_integer('warmup', 3, 'Untimed steps first (compilation).', lower_bound=0)
    flags.DEFINE_enum('data', 'auto', ['auto', 'real', 'random'], 'Batches to time.')
    flags.DEFINE_string('out', None, 'JSON path (default: results/train_speed_<name>.json).')
    flags.DEFINE_integer('profile_steps', 0, 'Steps traced with jax.profiler after the timing.')
    flags.DEFINE_string('profile_dir', None, 'Where the trace goes (with --profile_steps).')


def random_packed_batches(rows: int, length: int, vocab_size: int, seed: int = 0):
    """Endless packed batches of random ids in [3, V), shaped like the real ones."""
    rng = np.random.default_rng(seed)
    while True:
        seg = np.zeros((rows, length), np.int32)
        pos = np.zeros((rows, length), np.int32)
        for r in range(rows):
            start, index = 0, 1
            while start < length * 0.92:
                n = min(int(rng.integers(length // 8, length // 3 + 1)), length - start)
                seg[r, start : start + n], pos[r, start : start + n] = index, np.arange(n)
                start, index = start + n, index + 1
        ids = rng.integers(3, vocab_size, (2, rows, length))
        yield {
            'inputs': np.where(seg > 0, ids[0], 0).astype(np.int32),
            'targets': np.where(seg > 0, ids[1], 0).astype(np.int32),
            'inputs_segmentation': seg,
            'targets_segmentation': seg,
            'inputs_positions': pos,
            'targets_positions': pos,
        }


def random_setup(config, initial=None):
    """Model, Parallel, state, batches and dropout key without the data pipeline. The state
    is a fresh one, or a copy of ``initial`` (the step donates its state: the copy keeps
    ``initial`` for another step of the same parameters)."""
    tc = config.train
    model = training.build_model(config, config.data.vocab_size)
    tx, schedule = training.make_optimizer(config.opt, config.model.d_model)
    parallel = training.Parallel.from_config(config, model, tx, schedule)
    if initial is None:
        init_rng = jax.random.split(jax.random.key(tc.seed))[0]
        state = training.init_state(model, tx, init_rng, config.data.max_len)
    else:
        state = jax.tree.map(jnp.copy, initial)
    batches = random_packed_batches(tc.batch_size, config.data.max_len, config.data.vocab_size)
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    rng = training.dropout_key(tc.seed, tc.get('dropout_prng', 'threefry'))
    return model, parallel, parallel.put_state(state), batches, rng, num_params


def _real_setup(config):
    run = training.setup(config, tempfile.mkdtemp(prefix='train-speed-'))
    return run.model, run.parallel, run.state, run.train_iter, run.dropout_rng, run.num_params


def trace_steps(parallel, state, batches, rng, num_steps: int, directory: str):
    """``num_steps`` more steps under `jax.profiler.trace` (``perfetto_trace.json.gz`` somewhere
    under ``directory``), their batches placed on the devices before tracing starts."""
    placed = [parallel.put_batch(next(batches)) for _ in range(num_steps)]
    jax.block_until_ready(placed)
    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for batch in placed:
            state, sums = parallel.train_step(state, batch, rng)
        jax.block_until_ready(sums)
    return state


def _xla_flops(compiled) -> float | None:
    """XLA's FLOP count of a compiled step (pmap'ed functions expose no cost analysis)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float((cost or {}).get('flops', 0.0)) or None


def temp_bytes(compiled) -> int | None:
    """Bytes of temporaries XLA allocates for one step (activations kept for the backward
    pass, workspaces); None where the backend gives no memory analysis."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError):
        return None
    stats = stats[0] if isinstance(stats, list) else stats
    return None if stats is None else int(stats.temp_size_in_bytes)


def _data_mode(config) -> str:
    if FLAGS.data != 'auto':
        return FLAGS.data
    data = config.data
    local = data.dataset == 'synthetic' or data.get('manual_dir') or data.get('folder')
    return 'real' if local else 'random'


def main(argv):
    try:  # what cannot work, in one line before anything is built (training/footprint.py)
        training.check_config(FLAGS.config, jax.devices(), data=_data_mode(FLAGS.config) == 'real')
    except ConfigError as e:
        raise SystemExit(f'error: {e}') from None
    try:
        measure(FLAGS.config)
    except training.TrainingError as e:  # e.g. a compiled step the memory cannot hold
        raise SystemExit(f'error: {e}') from None
    except RuntimeError as e:  # jax.errors.JaxRuntimeError
        line = console.out_of_memory_line(e, training.OUT_OF_MEMORY)
        if line is None:
            raise
        raise SystemExit(f'error: {line}') from None


def measure(config) -> None:
    """Times ``--steps`` train steps of ``config``; prints and saves the result JSON."""
    tc = config.train
    mode = _data_mode(config)
    setup = _real_setup if mode == 'real' else random_setup
    model, parallel, state, batches, rng, num_params = setup(config)
    device = jax.devices()[0]
    step_flops = train_flops(model.config, tc.batch_size, config.data.max_len, config.data.max_len)
    # The step compiled ahead of time for XLA's own figures; `Parallel` keeps the executable,
    # so the first step below runs it without compiling again.
    first = parallel.put_batch(next(batches))
    compile_start = time.perf_counter()
    compiled = parallel.compile_step(state, first, rng)
    compile_s = time.perf_counter() - compile_start
    xla_flops = _xla_flops(compiled) if tc.parallelism == 'sharding' else None
    temp = temp_bytes(compiled)
    for _ in range(FLAGS.warmup):
        state, _ = parallel.train_step(state, next(batches), rng)
    jax.block_until_ready(state)
    tokens = 0.0
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
        batch = next(batches)
        tokens += float((batch['inputs'] != 0).sum() + (batch['targets'] != 0).sum())
        state, sums = parallel.train_step(state, batch, rng)
    jax.block_until_ready(sums)
    elapsed = time.perf_counter() - start
    profile_dir = None
    if FLAGS.profile_steps:
        profile_dir = FLAGS.profile_dir or tempfile.mkdtemp(prefix='train-speed-trace-')
        trace_steps(parallel, state, batches, rng, FLAGS.profile_steps, profile_dir)
    dtype = str(config.model.dtype)
    peak, peak_source = peak_flops(device, dtype)
    achieved = step_flops * FLAGS.steps / elapsed
    steps_per_s = FLAGS.steps / elapsed
    result = {
        'config': os.path.basename(config_flags.get_config_filename(flags.FLAGS['config'])),
        'data': mode,
        **common.host(),
        'xla_flags': os.environ.get('XLA_FLAGS', ''),
        'host_memory_kept': host_memory.applied,
        'parallelism': tc.parallelism,
        'dtype': dtype,
        'dropout_rate': config.model.dropout_rate,
        'dropout_prng': tc.get('dropout_prng', 'threefry'),
        'attention_impl': model.config.attention_impl,
        'remat': model.config.remat,
        'params': int(num_params),
        'batch_rows': tc.batch_size,
        'max_len': config.data.max_len,
        'steps': FLAGS.steps,
        'profile_steps': FLAGS.profile_steps,
        'profile_dir': profile_dir,
        'seconds': elapsed,
        'steps_per_s': steps_per_s,
        'ms_per_step': 1e3 / steps_per_s,
        'tokens_per_s': tokens / elapsed,
        'real_tokens_per_step': tokens / FLAGS.steps,
        'flops_per_step': step_flops,
        'xla_flops_per_step': xla_flops,
        'temp_bytes': temp,
        'compile_s': compile_s,
        'achieved_flops_per_s': achieved,
        'peak_flops_per_s': peak,
        'peak_source': peak_source,
        'mfu': achieved / peak,
        'num_steps': tc.num_steps,
        'projected_hours_for_num_steps': tc.num_steps / steps_per_s / 3600,
        'peak_host_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        'loss_after': float(np.asarray(sums['loss']).reshape(-1)[0])
        / float(np.asarray(sums['tokens']).reshape(-1)[0]),
    }
    if device.platform != 'cpu':
        stats = device.memory_stats() or {}
        result['peak_device_mib'] = stats.get('peak_bytes_in_use', 0) / 2**20
    out = FLAGS.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        'results',
        f'train_speed_{os.path.splitext(result["config"])[0]}.json',
    )
    print(json.dumps(result, indent=2))
    common.write_report(out, result)
    print(
        f'{result["ms_per_step"]:.0f} ms/step, {achieved / 1e12:.3f} TFLOP/s, MFU '
        f'{result["mfu"]:.1%} of {peak / 1e12:.3f} TFLOP/s ({peak_source}); '
        f'{tc.num_steps} steps would take {result["projected_hours_for_num_steps"]:.1f} h; '
        + ('no memory analysis' if temp is None else f'{temp / 2**20:.0f} MiB')
        + ' of XLA temporaries'
    )


if __name__ == '__main__':
    _define_flags()
    flags.mark_flag_as_required('config')
    app.run(main)
