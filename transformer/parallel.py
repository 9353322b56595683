"""Data (and tensor) parallelism behind one interface: `Parallel`.

Two modes (``train.parallelism``):

- ``'pmap'``: the train state is replicated on every device, each device takes its slice of
  the batch, and gradients are averaged with ``pmean`` over the ``'batch'`` axis.
- ``'sharding'``: one ``jit`` over a ``Mesh(('data', 'model'))`` with ``NamedSharding``: the
  batch is split on ``'data'``; parameters and optimizer state follow the logical axis names
  each parameter declares where it is created (transformer/attention.py, model.py), mapped
  onto mesh axes by `RULES`: heads and d_ff split on ``'model'`` when that axis is larger than
  1, everything else is replicated. XLA inserts the collectives.

The training loop sees neither mode: it hands host batches to `Parallel.train_step`, gets
global metric sums back, and reads one global copy of the state with `Parallel.get_state`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import jax_utils
from flax import linen as nn
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer import steps
from transformer.model import Transformer
from transformer.steps import Batch, TrainState

PyTree = Any

# Logical axis -> mesh axis (None = replicated). The one table that decides every layout.
RULES: tuple[tuple[str, str | None], ...] = (
    ('heads', 'model'),  # N: heads are independent until the output projection
    ('mlp', 'model'),  # F: the FFN's inner width
    ('embed', None),  # D
    ('kv', None),  # H
    ('vocab', None),  # V
)


def make_mesh(model_parallelism: int = 1, devices=None) -> jax.sharding.Mesh:
    """A ('data', 'model') mesh over ``devices`` (default: all), with Auto axis types.

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


def logical_specs(model: Transformer, tx: optax.GradientTransformation) -> TrainState:
    """The logical PartitionSpec of every leaf of the train state (optimizer state included:
    Adam's moments inherit their parameter's names), from an abstract init."""
    dummy = jnp.ones((1, 8), jnp.int32)

    def init():
        params = model.init(jax.random.key(0), dummy, dummy)['params']
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    return nn.get_partition_spec(jax.eval_shape(init))


def state_shardings(mesh: jax.sharding.Mesh, specs: PyTree, rules=RULES) -> PyTree:
    """NamedShardings of the train state: ``specs`` (from `logical_specs`) through ``rules``."""
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


class Parallel:
    """Compiled train / eval steps and host <-> device placement for one parallelism mode."""

    def __init__(
        self,
        mode: str,
        *,
        model: Transformer,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        label_smoothing: float,
        accum_steps: int,
        model_parallelism: int = 1,
        devices=None,
    ):
        if mode not in ('pmap', 'sharding'):
            raise ValueError(f"train.parallelism must be 'pmap' or 'sharding', got {mode!r}.")
        self.mode = mode
        self.devices = jax.local_devices() if devices is None else devices
        step = functools.partial(
            steps.train_step,
            model=model,
            tx=tx,
            schedule=schedule,
            label_smoothing=label_smoothing,
            accum_steps=accum_steps,
        )
        self._eval = jax.jit(
            functools.partial(steps.eval_step, model=model, label_smoothing=label_smoothing)
        )
        if mode == 'pmap':
            if model_parallelism != 1:
                raise ValueError("train.model_parallelism > 1 needs train.parallelism='sharding'.")
            self._step = jax.pmap(
                functools.partial(step, axis_name='batch'),
                axis_name='batch',
                in_axes=(0, 0, None),
                donate_argnums=(0,),
                devices=self.devices,
            )
        else:
            self.mesh = make_mesh(model_parallelism, self.devices)
            self._batch_sharding = NamedSharding(self.mesh, P('data'))
            self._state_shardings = state_shardings(self.mesh, logical_specs(model, tx))
            self._step = jax.jit(step, donate_argnums=(0,))

    @classmethod
    def from_config(
        cls,
        config: ml_collections.ConfigDict,
        model: Transformer,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        devices=None,
    ) -> Parallel:
        """The mode, loss and accumulation settings of ``config.train``."""
        tc = config.train
        return cls(
            tc.parallelism,
            model=model,
            tx=tx,
            schedule=schedule,
            label_smoothing=tc.label_smoothing,
            accum_steps=tc.grad_accum_steps,
            model_parallelism=tc.model_parallelism,
            devices=devices,
        )

    @property
    def num_data_shards(self) -> int:
        """How many ways the batch is split: its rows must be a multiple of this."""
        return len(self.devices) if self.mode == 'pmap' else self.mesh.shape['data']

    def put_state(self, state: TrainState) -> TrainState:
        """Host or single-device state -> the mode's device layout."""
        if self.mode == 'pmap':
            return jax_utils.replicate(state, self.devices)
        return jax.device_put(state, self._state_shardings)

    def get_state(self, state: TrainState) -> TrainState:
        """The mode's layout -> one global copy (for checkpoints and evaluation)."""
        if self.mode == 'pmap':
            return jax.tree.map(lambda x: x[0], state)
        return state

    def put_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host rows -> the mode's device layout (split over the data devices)."""
        n = self.num_data_shards
        rows = next(iter(batch.values())).shape[0]
        if rows % n:
            raise ValueError(f'Batch of {rows} rows does not split over {n} devices.')
        if self.mode == 'pmap':
            return {k: v.reshape(n, rows // n, *v.shape[1:]) for k, v in batch.items()}
        return jax.device_put(dict(batch), self._batch_sharding)

    def train_step(
        self, state: TrainState, batch: Batch, rng: jax.Array
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One step; the metric sums come back global and unreplicated in both modes."""
        state, sums = self._step(state, self.put_batch(batch), rng)
        if self.mode == 'pmap':
            sums = {k: v[0] for k, v in sums.items()}  # identical on every device
        return state, sums

    def eval_step(self, params: PyTree, batch: Batch) -> dict[str, jax.Array]:
        return self._eval(params, batch)
