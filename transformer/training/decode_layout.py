"""The layout a run decodes on (validation, evaluate, translate, the Python API): training's
mesh and sharding rules (transformer/training/parallel.py) as a `decoding.DecodeLayout`.

A run trained with ``train.parallelism='sharding'`` decodes on its ('data', 'model') mesh with
its parameters placed as in training (FSDP shards on ``data``; heads, d_ff and a vocabulary
the axis divides on ``model``); a run trained with ``'pmap'`` decodes on a data-only mesh over
all devices, parameters replicated, as its pmap held them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.decoding import DecodeLayout
from transformer.fields import ConfigError
from transformer.model import Transformer, logical_partition_specs, logical_shardings
from transformer.training import parallel


@dataclasses.dataclass(frozen=True)
class ParallelSettings:
    """``train.parallelism`` / ``model_parallelism`` / ``fsdp`` of a run, as the decoding
    commands take them (their flags of the same names override the run's)."""

    parallelism: str = 'sharding'
    model_parallelism: int = 1
    fsdp: bool = False

    @classmethod
    def of(cls, train: Any, **overrides: Any) -> ParallelSettings:
        """A run's ``train`` section, with the ``overrides`` that are not None."""
        settings = cls(train.parallelism, train.model_parallelism, bool(train.fsdp))
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(settings, **given)


def decode_layout(
    model: Transformer,
    settings: ParallelSettings = ParallelSettings(),
    *,
    gather_params: bool = False,
    devices=None,
) -> DecodeLayout:
    """The `DecodeLayout` of ``settings`` over ``devices`` (default: every process's).

    Raises:
      ConfigError: a layout the devices or the model cannot take (training's own checks:
        `parallel.make_mesh`, `parallel.check_layout`), in one line naming the key.
    """
    mode, model_axis, fsdp = settings.parallelism, settings.model_parallelism, settings.fsdp
    if mode not in parallel.MODES:
        raise ConfigError(f"parallelism must be 'pmap' or 'sharding', got {mode!r}.")
    if mode == 'pmap' and (model_axis != 1 or fsdp):
        raise ConfigError(
            "train.model_parallelism > 1 and train.fsdp need train.parallelism='sharding' "
            '(--parallelism sharding).'
        )
    devices = jax.devices() if devices is None else list(devices)
    try:
        mesh = parallel.make_mesh(model_axis, devices)
        parallel.check_layout(model, model_axis, mesh.shape['data'], fsdp)
        groups = parallel.data_groups(parallel.process_grid(mesh))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    specs = logical_partition_specs(model)
    if mode == 'pmap':
        shardings = jax.tree.map(
            lambda _: NamedSharding(mesh, P()), specs, is_leaf=lambda x: isinstance(x, P)
        )
    else:
        split = parallel.vocab_layout(model.config.vocab_size, model_axis)
        shardings = logical_shardings(specs, mesh, parallel.rules(fsdp, split))
    return DecodeLayout(mesh, shardings, groups, gather_params)


def training_layout(par: parallel.Parallel, gather_params: bool = False) -> DecodeLayout:
    """The layout validation decodes on: the training run's own mesh, and its parameters'
    shardings (`Parallel.global_state`'s: the train state's without the optimizer)."""
    groups = parallel.data_groups(parallel.process_grid(par.mesh))
    return DecodeLayout(par.mesh, par.shardings.params, groups, gather_params)
