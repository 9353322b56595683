"""The ('data', 'model') mesh over every process's devices, and which rows of the global
batch each process feeds (transformer/training/parallel.py builds its steps on them)."""

from __future__ import annotations

import jax
import numpy as np


def make_mesh(model_parallelism: int = 1, devices=None) -> jax.sharding.Mesh:
    """A ('data', 'model') mesh over ``devices`` (default: all processes'), Auto axis types.

    ``jax.make_mesh`` now defaults to Explicit axes, under which ordinary Flax code does not
    trace; Auto lets XLA propagate shardings from the inputs.
    """
    devices = jax.devices() if devices is None else devices
    if len(devices) % model_parallelism:
        raise ValueError(
            f'train.model_parallelism={model_parallelism} does not divide the '
            f'{len(devices)} devices.'
        )
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh(
        (len(devices) // model_parallelism, model_parallelism),
        ('data', 'model'),
        axis_types=(auto, auto),
        devices=devices,
    )


def data_groups(process_of: np.ndarray) -> dict[int, tuple[int, int]]:
    """Which rows of the global batch each process feeds, from the mesh's layout.

    The batch is split over the mesh's ``data`` axis: data index i holds the i-th block of
    rows. A process feeds the blocks of the data indices its devices hold, so processes
    whose devices share their data indices (the ``model`` axis spans them) feed the same
    rows; `jax.make_array_from_process_local_data` takes each such copy as the same global
    rows.

    Args:
      process_of: [data, model] array, the process index of each mesh device.

    Returns:
      ``{process: (group, groups)}``: the process feeds block ``group`` of ``groups`` equal,
      consecutive blocks of the global batch.

    Raises:
      ValueError: a layout whose processes hold overlapping but different, non-consecutive
        or unequal sets of data indices (no block of rows fits each process).
    """
    held: dict[int, tuple[int, ...]] = {}
    for p in np.unique(process_of):
        held[int(p)] = tuple(int(i) for i in np.flatnonzero((process_of == p).any(axis=1)))
    groups = sorted(set(held.values()))
    covered = [i for g in groups for i in g]
    if covered != list(range(process_of.shape[0])) or len({len(g) for g in groups}) != 1:
        where = ', '.join(f'process {p}: {list(g)}' for p, g in sorted(held.items()))
        raise ValueError(
            f'The mesh ({process_of.shape[0]} data x {process_of.shape[1]} model) gives the '
            f'processes data indices that no split of the batch fits ({where}): choose a '
            'train.model_parallelism that divides, or is a multiple of, the devices of '
            'each process.'
        )
    return {p: (groups.index(g), len(groups)) for p, g in held.items()}


def process_grid(mesh: jax.sharding.Mesh) -> np.ndarray:
    """[data, model]: the process index of each device of a ('data', 'model') mesh."""
    return np.vectorize(lambda d: d.process_index, otypes=[int])(mesh.devices)
