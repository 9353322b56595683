"""Config values checked before a run writes anything: one line for the first bad value.

ml_collections already rejects a command-line value that does not parse as the field's type
(``--config.model.d_model=abc``); the typed schema (transformer/schema/) catches what parses
but cannot work (a dropout rate of 1, zero warmup steps, a beam of 0, an infinite learning
rate, a split the data source does not have) and values of the wrong type set in a config
file; `check` adds what needs the devices and the disk (a batch they cannot split, a length
or batch whose step cannot fit their memory, a folder without the split's files, a split
or language a TFDS dataset does not have).
The command line's own errors (an unknown ``--config.KEY``) are the commands' (commands/
config_flag.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformer import schema
from transformer.schema import ConfigError

__all__ = ['OUT_OF_MEMORY', 'TRAINING_OUT_OF_MEMORY', 'ConfigError', 'check']

# The end of the one line that a train step out of memory stops with (train.py adds
# `TRAINING_OUT_OF_MEMORY`'s sentences; benchmarks/train_speed.py uses this alone).
OUT_OF_MEMORY = (
    'Lower train.batch_size, or raise train.grad_accum_steps (the same rows in smaller '
    'micro-batches).'
)
TRAINING_OUT_OF_MEMORY = (
    f'{OUT_OF_MEMORY} Validation decodes eval.batch_size sentences at a time. Checkpoints '
    'already saved are untouched.'
)


def check(
    config: schema.Config, devices: Sequence[Any] | None = None, *, data: bool = True
) -> schema.Experiment:
    """The typed config; raises `ConfigError` for the first value that cannot work.

    Args:
      config: the experiment config, from a config file (parsed here) or typed already.
      devices: the devices training will use (default: all devices of all processes); the
        batch must split over them, and what a step needs at least must fit their memory
        (transformer/training/footprint.py). Skipped for a multi-host run before
        jax.distributed joins.
      data: also check the data source's files and splits (a TFDS dataset's metadata imports
        TensorFlow): False where no data is read (benchmarks on random batches).
    """
    experiment = config if isinstance(config, schema.Experiment) else schema.parse(config)
    tc = experiment.train
    if tc.distributed and devices is None:
        return experiment  # jax cannot be asked for devices before jax.distributed joins
    import jax

    from transformer import data as data_lib
    from transformer.data import sources as data_sources
    from transformer.training import footprint, parallel

    devices = jax.devices() if devices is None else devices
    model_parallelism = tc.model_parallelism if tc.parallelism == 'sharding' else 1
    if len(devices) % model_parallelism:
        raise ConfigError(
            f'train.model_parallelism={model_parallelism} does not divide the {len(devices)} '
            'devices.'
        )
    try:  # which rows each process feeds follows the mesh; some layouts fit no split
        parallel.data_groups(parallel.process_grid(parallel.make_mesh(model_parallelism, devices)))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rows = len(devices) // model_parallelism * tc.grad_accum_steps
    if tc.batch_size % rows:
        raise ConfigError(
            f'train.batch_size={tc.batch_size} must be a multiple of data-parallel devices x '
            f'train.grad_accum_steps = {rows}.'
        )
    # The model axis splits the heads, key/value heads and d_ff; FSDP splits d_model.
    data_shards = len(devices) // model_parallelism
    fsdp = tc.fsdp and tc.parallelism == 'sharding'
    parallel.check_model_layout(experiment.model, model_parallelism, data_shards, fsdp)
    footprint.check(experiment, devices)
    if not data:
        return experiment
    try:  # files a folder of text must hold, splits a TFDS dataset has: before any write
        splits = (experiment.data.train_split, experiment.data.eval_split)
        data_sources.check_files(experiment.data, splits)
        data_lib.check_mix_files(experiment.data)
        data_sources.check_dataset(experiment.data)
    except data_sources.DataError as e:
        raise ConfigError(str(e)) from None
    return experiment
