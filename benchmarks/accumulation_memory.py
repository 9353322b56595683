r"""Compiled per-device memory of the train step for gradient accumulation 1 / 2 / 4.

  python benchmarks/accumulation_memory.py --config configs/multi30k.py \
      --config.data.manual_dir=../shared/data/multi30k --devices 2

Compiles (does not run) the config's step in 'sharding' mode over ``--devices`` CPU devices
for each A and prints XLA's memory analysis: temporaries (activations), arguments, outputs,
and the per-device rows of the [rows, T, V] logits in the compiled HLO (rows / (devices x A)
with strided micro-batches). Saves JSON in results/accumulation_memory.json.
"""

import json
import os
import re
import sys
import tempfile

_DEVICES = next((a.split('=')[1] for a in sys.argv if a.startswith('--devices=')), '2')
os.environ.setdefault('XLA_FLAGS', f'--xla_force_host_platform_device_count={_DEVICES}')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer import training  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config.', lock_config=False)
flags.DEFINE_integer('devices', 2, 'CPU devices (set before jax starts).')
_ACCUM = flags.DEFINE_list('accum', ['1', '2', '4'], 'Accumulation steps to compile.')


def main(argv):
    del argv
    config = _CONFIG.value
    config.train.parallelism = 'sharding'
    results = []
    for accum in map(int, _ACCUM.value):
        config.train.grad_accum_steps = accum
        run = training.setup(config, tempfile.mkdtemp(prefix='accum-memory-'))
        batch = run.parallel.put_batch(next(run.train_iter))
        compiled = run.parallel.lower_step(run.state, batch, run.dropout_rng).compile()
        memory = compiled.memory_analysis()
        vocab, length = run.tokenizer.vocab_size, config.data.max_len
        rows = sorted(
            {int(r) for r in re.findall(rf'f32\[(\d+),{length},{vocab}\]', compiled.as_text())}
        )
        results.append(
            {
                'grad_accum_steps': accum,
                'devices': len(jax.devices()),
                'batch_rows': config.train.batch_size,
                'logits_rows_per_device': rows,
                'temp_mib': memory.temp_size_in_bytes / 2**20,
                'argument_mib': memory.argument_size_in_bytes / 2**20,
                'output_mib': memory.output_size_in_bytes / 2**20,
            }
        )
        print(json.dumps(results[-1]))
    out = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), 'results', 'accumulation_memory.json'
    )
    with open(out, 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    flags.mark_flag_as_required('config')
    app.run(main)
