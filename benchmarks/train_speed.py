r"""Training throughput of a config: steps/s, tokens/s, achieved FLOP/s, peak memory.

  python benchmarks/train_speed.py --config configs/multi30k.py \
      --config.data.manual_dir=../shared/data/multi30k --steps 30

Runs the real train step (the config's parallelism mode over all local devices) on the real
packed batches, after a few untimed steps that compile it, and saves a JSON next to this file
in results/. FLOPs per step come from XLA's cost analysis of the compiled step.
"""

import json
import os
import platform
import resource
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer import trainer  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config.', lock_config=True)
_STEPS = flags.DEFINE_integer('steps', 30, 'Timed steps.')
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed steps first (compilation).')
_OUT = flags.DEFINE_string('out', None, 'JSON path (default: results/train_speed_<name>.json).')


def main(argv):
    del argv
    config = _CONFIG.value
    tc = config.train
    # The training command's own set-up, in a scratch workdir (no checkpoint to resume).
    run = trainer.setup(config, tempfile.mkdtemp(prefix='train-speed-'))
    parallel, state, batches, rng = run.parallel, run.state, run.train_iter, run.dropout_rng
    num_params = run.num_params
    first = next(batches)
    placed = parallel.put_batch(first)
    flops = None
    if tc.parallelism == 'sharding':
        # pmap'ed functions expose no cost analysis; the jit step does.
        cost = parallel._step.lower(state, placed, rng).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops = float(cost.get('flops', 0.0)) or None
    for _ in range(_WARMUP.value):
        state, sums = parallel.train_step(state, next(batches), rng)
    jax.block_until_ready(sums)
    tokens = 0.0
    start = time.perf_counter()
    for _ in range(_STEPS.value):
        batch = next(batches)
        tokens += float((batch['inputs'] != 0).sum() + (batch['targets'] != 0).sum())
        state, sums = parallel.train_step(state, batch, rng)
    jax.block_until_ready(sums)
    elapsed = time.perf_counter() - start
    device = jax.devices()[0]
    result = {
        'config': os.path.basename(config_flags.get_config_filename(flags.FLAGS['config'])),
        'device': f'{device.platform}:{getattr(device, "device_kind", "")}',
        'num_devices': len(jax.devices()),
        'cpu_count': os.cpu_count(),
        'machine': platform.machine(),
        'jax': jax.__version__,
        'parallelism': tc.parallelism,
        'params': int(num_params),
        'batch_rows': tc.batch_size,
        'max_len': config.data.max_len,
        'steps': _STEPS.value,
        'seconds': elapsed,
        'steps_per_s': _STEPS.value / elapsed,
        'tokens_per_s': tokens / elapsed,
        'real_tokens_per_step': tokens / _STEPS.value,
        'flops_per_step': flops,
        'achieved_flops_per_s': flops * _STEPS.value / elapsed if flops else None,
        'peak_host_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        'loss_after': float(np.asarray(sums['loss']).reshape(-1)[0])
        / float(np.asarray(sums['tokens']).reshape(-1)[0]),
    }
    if device.platform == 'gpu':
        stats = device.memory_stats() or {}
        result['peak_device_mib'] = stats.get('peak_bytes_in_use', 0) / 2**20
    out = _OUT.value or os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        'results',
        f'train_speed_{os.path.splitext(result["config"])[0]}.json',
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == '__main__':
    flags.mark_flag_as_required('config')
    app.run(main)
