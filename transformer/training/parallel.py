"""Data (and tensor / FSDP) parallelism behind one interface: `Parallel`.

Two modes (``train.parallelism``):

- ``'sharding'`` (default, as JAX recommends): one ``jit`` over a ``Mesh(('data', 'model'))``
  of every process's devices, with ``NamedSharding``: the batch is split on ``'data'``;
  parameters and optimizer state follow the logical axis names each parameter declares where
  it is created (transformer/model/: projections.py, layers.py, transformer.py), mapped onto
  mesh axes by one rules table (`rules`): heads, d_ff and the vocabulary (where the axis
  divides it: `splits_vocab`) on ``'model'``, and with
  ``train.fsdp`` the d_model axis of every parameter on ``'data'`` (FSDP / ZeRO-3: each
  device holds 1/data of the parameters and of Adam's moments). XLA inserts the collectives.
- ``'pmap'``: the train state is replicated on every device, each device takes its slice of
  the batch, and gradients are averaged with ``pmean`` over all devices of all processes.

Multi-host: both modes span ``jax.devices()`` (all processes), and each process places only
its own rows of the global batch (``jax.make_array_from_process_local_data`` / its local pmap
devices), so collectives are global, not host-local. Which rows are a process's own follows
the mesh (`data_groups`): processes whose devices hold the same ``data`` indices (a ``model``
axis that spans processes) feed the same rows. The loop sees neither mode: it hands
host rows to `Parallel.put_batch`, steps with `Parallel.train_step`, gets global metric sums
back, and reads the *global* train state (what Orbax saves and restores collectively, on any
number of devices or processes) with `Parallel.global_state`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import jax_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer import schema
from transformer.model import (
    Transformer,
    in_activation_layout,
    logical_partition_specs,
    logical_shardings,
    remat_compiler_options,
    settings,
)
from transformer.schema import PARALLELISMS
from transformer.training import steps
from transformer.training.mesh import data_groups, make_mesh, process_grid
from transformer.training.steps import Batch, TrainState

PyTree = Any


MODES = PARALLELISMS  # see the module docstring


def rules(fsdp: bool = False, split_vocab: bool = False) -> tuple[tuple[str, str | None], ...]:
    """Logical axis -> mesh axis (None = replicated): the one table that decides every layout,
    of parameters and activations (model/constraints.py); a mesh axis goes to the first rule.
    ``split_vocab``: the vocabulary on 'model' too (`splits_vocab`)."""
    return (
        ('batch', 'data'),  # B, activations only: before 'embed' takes 'data' (FSDP)
        ('length', None),  # T / S, activations only
        ('heads', 'model'),  # N: heads are independent until the output projection
        ('mlp', 'model'),  # F: the FFN's inner width
        ('embed', 'data' if fsdp else None),  # D: every parameter has it but biases of wi
        ('kv', None),  # H
        ('vocab', 'model' if split_vocab else None),  # V: the [V, D] tables and the logits
        ('positions', None),  # a learned position table's rows (model.positions='bart_learned')
        ('relpos_buckets', None),  # T5's relative position buckets (model.positions='t5_relative')
        ('layers', None),  # L, the stacked layers' axis (model.scan_layers): every layer here
    )


def splits_vocab(vocab_size: int, model_parallelism: int) -> bool:
    """Whether the 'model' axis splits the vocabulary axis (the [V, D] embedding, a [D, V]
    output projection, the [V] logits bias, the logits): where the axis has more than one
    device and divides V. Otherwise V stays whole on every device: jit's shardings need equal
    shards, and padding V would change the parameters' shapes that checkpoints and exports
    hold (NLLB-200's 256206 pieces split over 2 devices, not over 4)."""
    return model_parallelism > 1 and vocab_size % model_parallelism == 0


def vocab_layout(vocab_size: int, model_parallelism: int) -> bool:
    """`splits_vocab`, with a log line where a 'model' axis leaves the vocabulary whole."""
    split = splits_vocab(vocab_size, model_parallelism)
    if model_parallelism > 1 and not split:
        logging.info(
            "The vocabulary's %d pieces stay whole on each device: the model axis of %d does "
            'not divide them (heads and d_ff are split).',
            vocab_size,
            model_parallelism,
        )
    return split


def logical_specs(model: Transformer, tx: optax.GradientTransformation) -> TrainState:
    """The logical PartitionSpec of every leaf of the train state (optimizer state included:
    Adam's moments inherit their parameter's names), from an abstract init."""

    def state(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    return logical_partition_specs(model, state)


def state_shardings(
    mesh: jax.sharding.Mesh, specs: PyTree, fsdp: bool = False, split_vocab: bool = False
) -> PyTree:
    """NamedShardings of the train state: ``specs`` (from `logical_specs`) through `rules`."""
    return logical_shardings(specs, mesh, rules(fsdp, split_vocab))


def check_layout(model: Transformer, model_parallelism: int, data_shards: int, fsdp: bool):
    """One-line errors (`schema.ConfigError`, a ValueError), before anything compiles, for a
    layout the model cannot take."""
    check_model_layout(model.config, model_parallelism, data_shards, fsdp)


def check_model_layout(cfg, model_parallelism: int, data_shards: int, fsdp: bool) -> None:
    """`check_layout` of the model section ``cfg`` (a TransformerConfig), before a run writes
    anything (transformer/training/config_checks.py)."""
    if model_parallelism > 1:
        # Query heads, key/value heads and d_ff are split over the 'model' axis (`rules`).
        kv_heads = ('model.num_kv_heads', settings.num_kv_heads(cfg))
        for name, size in (('model.num_heads', cfg.num_heads), kv_heads, ('model.d_ff', cfg.d_ff)):
            if size % model_parallelism:
                raise schema.ConfigError(
                    f'train.model_parallelism={model_parallelism} does not divide '
                    f'{name}={size}: choose a divisor of the heads, key/value heads and d_ff.'
                )
    if fsdp and cfg.d_model % data_shards:
        raise schema.ConfigError(
            f'train.fsdp shards model.d_model={cfg.d_model} over {data_shards} data devices, '
            'which does not divide it: change the device count or turn fsdp off.'
        )


class Parallel:
    """Compiled train / eval steps and host <-> device placement for one parallelism mode."""

    # Called with each newly compiled train step and the devices, before it runs (training's
    # memory check, transformer/training/stops.py `check_memory`); raises to stop the run.
    check_compiled: Callable[[jax.stages.Compiled, list], None] | None = None

    def __init__(
        self,
        mode: str,
        *,
        model: Transformer,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        label_smoothing: float,
        accum_steps: int,
        loss_chunk_tokens: int = 0,
        rdrop_alpha: float = 0.0,
        z_loss: float = 0.0,
        model_parallelism: int = 1,
        fsdp: bool = False,
        devices=None,
        batch_size: int | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"train.parallelism must be 'pmap' or 'sharding', got {mode!r}.")
        if mode == 'pmap' and (model_parallelism != 1 or fsdp):
            raise ValueError(
                "train.model_parallelism > 1 and train.fsdp need train.parallelism='sharding'."
            )
        self.mode = mode
        self.devices = list(jax.devices() if devices is None else devices)
        self.local_devices = [d for d in self.devices if d.process_index == jax.process_index()]
        self.mesh = make_mesh(model_parallelism, self.devices)
        # The block of the global batch this process feeds (see `data_groups`).
        self.data_group, self.data_groups = data_groups(process_grid(self.mesh))[
            jax.process_index()
        ]
        self.batch_size = batch_size  # global rows; None: this process's rows x data_groups
        check_layout(model, model_parallelism, self.mesh.shape['data'], fsdp)
        self._compiled: dict[tuple, jax.stages.Compiled] = {}  # `compile_step`'s, by batch shape
        # model.remat on a CPU: options that keep the recomputation in the backward pass.
        self._compiler_options = remat_compiler_options(
            model.config.remat, self.devices[0].platform
        )
        loss = {
            'label_smoothing': label_smoothing,
            'loss_chunk_tokens': loss_chunk_tokens,
            'z_loss': z_loss,
        }
        train = {'accum_steps': accum_steps, 'rdrop_alpha': rdrop_alpha}  # not for _eval
        step = functools.partial(
            steps.train_step, model=model, tx=tx, schedule=schedule, **train, **loss
        )
        evaluate = functools.partial(steps.eval_step, model=model, **loss)
        specs = logical_specs(model, tx)
        if mode == 'pmap':
            self._step, self._eval = self._pmapped(step, evaluate, specs)
        else:
            split = vocab_layout(model.config.vocab_size, model_parallelism)
            self.shardings = state_shardings(self.mesh, specs, fsdp, split)
            self._batch_sharding = NamedSharding(self.mesh, P('data'))
            self._step, self._eval = self._sharded(step, evaluate, rules(fsdp, split))

    def _pmapped(self, step: Callable, evaluate: Callable, specs) -> tuple[Callable, Callable]:
        """The pmap mode's train step (one copy of the state per local device, the batch
        split over them) and its eval step (jitted, on the decoding layout's data-only
        mesh); the global state is replicated (``specs``: its logical partition specs)."""
        self.shardings = jax.tree.map(
            lambda _: NamedSharding(self.mesh, P()), specs, is_leaf=lambda x: isinstance(x, P)
        )
        local_mesh = jax.sharding.Mesh(np.array(self.local_devices), ('local',))
        self._local_sharding = NamedSharding(local_mesh, P('local'))
        train = jax.pmap(
            functools.partial(step, axis_name='batch'),
            axis_name='batch',
            in_axes=(0, 0, None),
            donate_argnums=(0,),
            devices=self.devices,
        )
        return train, jax.jit(evaluate)

    def _sharded(self, step: Callable, evaluate: Callable, layout) -> tuple[Callable, Callable]:
        """The sharding mode's train and eval steps: explicit in and out shardings (the
        state's, the batch's), so that the state keeps its layout step after step, and the
        activations constrained by the rules table ``layout``."""
        replicated = NamedSharding(self.mesh, P())
        train = jax.jit(
            in_activation_layout(step, self.mesh, layout),
            in_shardings=(self.shardings, self._batch_sharding, replicated),
            out_shardings=(self.shardings, replicated),
            donate_argnums=(0,),
        )
        evaluation = jax.jit(
            in_activation_layout(evaluate, self.mesh, layout),
            in_shardings=(self.shardings.params, self._batch_sharding),
            out_shardings=replicated,
        )
        return train, evaluation

    @classmethod
    def from_config(
        cls,
        config: schema.Experiment,
        model: Transformer,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        devices=None,
    ) -> Parallel:
        """The mode, layout, loss and accumulation settings of ``config.train``."""
        tc = config.train
        return cls(
            tc.parallelism,
            model=model,
            tx=tx,
            schedule=schedule,
            label_smoothing=tc.label_smoothing,
            accum_steps=tc.grad_accum_steps,
            loss_chunk_tokens=tc.loss_chunk_tokens,
            rdrop_alpha=tc.rdrop_alpha,
            z_loss=tc.z_loss,
            model_parallelism=tc.model_parallelism,
            fsdp=tc.fsdp,
            devices=devices,
            batch_size=tc.batch_size,
        )

    @property
    def num_data_shards(self) -> int:
        """How many ways the global batch is split: its rows must be a multiple of this."""
        return len(self.devices) if self.mode == 'pmap' else self.mesh.shape['data']

    # --- the train state: global (what checkpoints hold) <-> the step's layout --------------

    def init_state(self, init: Callable[..., TrainState], *args: Any) -> TrainState:
        """Runs ``init(*args)`` so that its result is born global in the mode's layout (FSDP
        never materialises the whole state on one device); ``args``: arrays (traced)."""
        # Waited for here, so that a state that does not fit fails now, with its error.
        return jax.block_until_ready(jax.jit(init, out_shardings=self.shardings)(*args))

    def abstract_state(self, init: Callable[[], TrainState]) -> TrainState:
        """Shapes, dtypes and global shardings of ``init()``: the target of a restore."""
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            jax.eval_shape(init),
            self.shardings,
        )

    def put_state(self, state: TrainState) -> TrainState:
        """Global state -> the layout the step takes (pmap: one copy per local device)."""
        if self.mode == 'pmap':
            local = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), state)
            return jax_utils.replicate(local, self.local_devices)
        return jax.device_put(state, self.shardings)  # a no-op for a state born global

    def global_state(self, state: TrainState) -> TrainState:
        """The step's layout -> global arrays (for checkpoints and evaluation)."""
        if self.mode == 'pmap':
            return jax.tree.map(
                lambda x, s: jax.make_array_from_process_local_data(
                    s, np.asarray(x.addressable_data(0))[0]
                ),
                state,
                self.shardings,
            )
        return state

    # --- batches and steps --------------------------------------------------------------------

    def put_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows of the global batch (block `data_group` of `data_groups`) ->
        the mode's device layout; rows that do not make the configured batch raise."""
        rows = next(iter(batch.values())).shape[0]
        global_rows = self.batch_size or rows * self.data_groups
        if rows * self.data_groups != global_rows:
            raise ValueError(
                f'This process fed {rows} rows; the global batch of {global_rows} needs '
                f'{global_rows // self.data_groups} from each of {self.data_groups} data groups.'
            )
        if self.mode == 'pmap':
            n = len(self.local_devices)
            if rows % n:
                raise ValueError(f'Batch of {rows} rows does not split over {n} devices.')
            split = {k: v.reshape(n, rows // n, *v.shape[1:]) for k, v in batch.items()}
            return jax.device_put(split, self._local_sharding)
        return {
            k: jax.make_array_from_process_local_data(
                self._batch_sharding, v, (global_rows, *v.shape[1:])
            )
            for k, v in batch.items()
        }

    def train_step(
        self, state: TrainState, batch: Mapping[str, Any], rng: jax.Array
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One step on a batch (host rows, or already placed by `put_batch`); the metric sums
        come back global and unreplicated in both modes. It runs the executable of
        `compile_step`, compiled at the first call unless a caller compiled it before."""
        if not isinstance(next(iter(batch.values())), jax.Array):
            batch = self.put_batch(batch)
        state, sums = self.compile_step(state, batch, rng)(state, batch, rng)
        if self.mode == 'pmap':
            sums = {k: v[0] for k, v in sums.items()}  # identical on every device
        return state, sums

    def compile_step(
        self, state: TrainState, batch: Mapping[str, jax.Array], rng: jax.Array
    ) -> Callable:
        """The train step compiled for these arguments (``batch`` placed by `put_batch`), once
        per batch shape, and passed to `check_compiled` where set: `train_step` runs this
        same executable, so XLA's memory analysis is read before the first step without
        compiling twice (but in multi-process pmap runs). Compiling takes a while on a big
        model and is said."""
        key = tuple((k, v.shape, v.dtype) for k, v in sorted(batch.items()))
        if key not in self._compiled:
            logging.info('Compiling the training step ...')
            start = time.perf_counter()
            lowered = self.lower_step(state, batch, rng)
            compiled = lowered.compile(compiler_options=self._compiler_options)
            logging.info('Compiled the training step in %.1f s.', time.perf_counter() - start)
            if self.check_compiled is not None:
                self.check_compiled(compiled, self.devices)
            if self.mode == 'pmap' and jax.process_count() > 1:
                # jax checks a multi-process pmap's AOT executable against the global
                # shapes, not this process's: the pmap itself runs (and compiles once more,
                # without `_compiler_options`).
                compiled = self._step
            self._compiled[key] = compiled
        return self._compiled[key]

    def lower_step(
        self, state: TrainState, batch: Mapping[str, jax.Array], rng: jax.Array
    ) -> jax.stages.Lowered:
        """The train step lowered for these arguments (``batch`` placed by `put_batch`), to
        compile without running (XLA's memory and cost analysis, its HLO)."""
        return self._step.lower(state, batch, rng)

    def eval_step(self, params: PyTree, batch: Batch) -> dict[str, jax.Array]:
        """Summed loss metrics of one batch: parameters in the training layout
        (`global_state`), rows placed on the mesh by `decoding.place_rows`."""
        return self._eval(params, batch)
