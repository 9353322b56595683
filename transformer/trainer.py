"""Training: the loss, train/eval steps, data parallelism, the loop and its checkpoints.

Data parallelism comes in two modes (``train.parallelism``):

- ``'pmap'``: the train state is replicated on every local device, each device takes its
  slice of the batch, and gradients are averaged with ``pmean`` over the ``'batch'`` axis.
- ``'sharding'``: one ``jit`` over a ``Mesh(('data', 'model'))`` with ``NamedSharding``: the
  batch is split on ``'data'``; parameters are replicated over ``'data'`` and, when the
  ``'model'`` axis is larger than 1, split on their head (or d_ff) axis, so the same code
  runs data- and tensor-parallel. XLA inserts the collectives.

Both normalise the loss by the number of real target tokens of the *global* batch, so they
compute the same update as one device holding the whole batch.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import jax_utils, struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer import console, evaluate, optim
from transformer import data as data_lib
from transformer.model import PAD_ID, Transformer, config_from_dict

Array = jax.Array
PyTree = Any
Batch = Mapping[str, Array]


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message says why and what was kept."""


@struct.dataclass
class TrainState:
    """What a step changes. The dropout key is derived from (seed, step), so it needs no slot."""

    step: Array
    params: PyTree
    opt_state: PyTree


# ---------------------------------------------------------------------------------------------
# Loss and metrics.


def cross_entropy_with_smoothing(
    logits: Array, targets: Array, weights: Array, label_smoothing: float
) -> tuple[Array, Array]:
    """Summed label-smoothed and plain cross-entropy over the weighted target positions.

    The smoothed target puts 1 - eps on the reference token and eps / (V - 1) on each other
    token (Sec. 5.4). Written with log_softmax and constants only, never log of a probability,
    so it is finite for any logits: with q = low + (conf - low) * onehot,
    -sum_v q_v log p_v = -(conf - low) log p_target - low * sum_v log p_v.

    Args:
      logits: [B, T, V].
      targets: [B, T] token ids.
      weights: [B, T], 1 for real target tokens, 0 for padding.
      label_smoothing: eps_ls.

    Returns:
      (smoothed loss sum, NLL sum), each a float32 scalar.
    """
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    smoothed = -(confidence - low) * target_log_prob - low * log_probs.sum(axis=-1)
    return (smoothed * weights).sum(), (-target_log_prob * weights).sum()


def smoothing_floor(vocab_size: int, label_smoothing: float) -> float:
    """The smallest possible smoothed loss per token: the entropy of the smoothed target."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    entropy = -confidence * math.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy -= (vocab_size - 1) * low * math.log(low)
    return entropy


def _loss_sums(
    params: PyTree, batch: Batch, model: Transformer, label_smoothing: float, rng: Array | None
) -> tuple[Array, dict[str, Array]]:
    """Summed smoothed loss of a batch (for the gradient) and the sums its metrics need."""
    train = rng is not None
    logits = model.apply(
        {'params': params},
        batch['inputs'],
        batch['targets'],
        train=train,
        inputs_segmentation=batch.get('inputs_segmentation'),
        targets_segmentation=batch.get('targets_segmentation'),
        inputs_positions=batch.get('inputs_positions'),
        targets_positions=batch.get('targets_positions'),
        rngs={'dropout': rng} if train else None,
    )
    weights = (batch['targets'] != PAD_ID).astype(jnp.float32)
    loss, nll = cross_entropy_with_smoothing(logits, batch['targets'], weights, label_smoothing)
    correct = ((logits.argmax(-1) == batch['targets']) * weights).sum()
    sums = {'loss': loss, 'nll': nll, 'correct': correct, 'tokens': weights.sum()}
    return loss, sums


def summarize(sums: Mapping[str, Any], vocab_size: int, label_smoothing: float) -> dict:
    """Per-token metrics from summed ones (host side, after the step)."""
    tokens = max(float(sums['tokens']), 1.0)
    loss = float(sums['loss']) / tokens
    nll = float(sums['nll']) / tokens
    out = {
        'loss': loss,
        'nll': nll,
        'perplexity': math.exp(min(nll, 50.0)),
        'loss_above_floor': loss - smoothing_floor(vocab_size, label_smoothing),
        'accuracy': float(sums['correct']) / tokens,
        'target_tokens': tokens,
    }
    for key in ('grad_norm', 'learning_rate', 'source_tokens'):
        if key in sums:
            out[key] = float(sums[key])
    return out


# ---------------------------------------------------------------------------------------------
# Steps.


def _accumulated_grads(
    params: PyTree,
    batch: Batch,
    model: Transformer,
    label_smoothing: float,
    rng: Array,
    accum_steps: int,
) -> tuple[PyTree, dict[str, Array]]:
    """Gradient of the summed loss, accumulated over ``accum_steps`` micro-batches.

    The micro-batches are consecutive row blocks of ``batch``; summing (not averaging) the
    gradients and the token counts keeps the normalisation by the total token count exact.
    """
    grad_fn = jax.grad(_loss_sums, has_aux=True)
    if accum_steps == 1:
        return grad_fn(params, batch, model, label_smoothing, rng)
    micro = jax.tree.map(lambda x: x.reshape(accum_steps, -1, *x.shape[1:]), batch)

    def body(carry, xs):
        micro_batch, index = xs
        grads, sums = grad_fn(
            params, micro_batch, model, label_smoothing, jax.random.fold_in(rng, index)
        )
        return jax.tree.map(jnp.add, carry, (grads, sums)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    zero_sums = {k: jnp.zeros((), jnp.float32) for k in ('loss', 'nll', 'correct', 'tokens')}
    (grads, sums), _ = jax.lax.scan(body, (zeros, zero_sums), (micro, jnp.arange(accum_steps)))
    return grads, sums


def train_step(
    state: TrainState,
    batch: Batch,
    base_rng: Array,
    *,
    model: Transformer,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    label_smoothing: float,
    accum_steps: int,
    axis_name: str | None = None,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser step on the (local part of the) batch.

    Under ``pmap`` (``axis_name`` set) each device folds its index into the dropout key and
    the gradient and token sums are averaged over devices with ``pmean``: the ratio of the two
    means is the global token-normalised gradient. Under ``jit`` the batch is global already.
    """
    rng = jax.random.fold_in(base_rng, state.step)
    if axis_name is not None:
        rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    grads, sums = _accumulated_grads(state.params, batch, model, label_smoothing, rng, accum_steps)
    if axis_name is not None:
        grads, sums = jax.lax.pmean((grads, sums), axis_name)
    tokens = jnp.maximum(sums['tokens'], 1.0)
    grads = jax.tree.map(lambda g: g / tokens, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if axis_name is not None:
        # Per-device means back to global sums, so metrics read the same in both modes.
        sums = jax.tree.map(lambda x: x * jax.lax.psum(1, axis_name), sums)
    sums['grad_norm'] = optax.tree.norm(grads)
    sums['learning_rate'] = schedule(state.step)
    source_tokens = (batch['inputs'] != PAD_ID).sum().astype(jnp.float32)
    sums['source_tokens'] = (
        jax.lax.psum(source_tokens, axis_name) if axis_name is not None else source_tokens
    )
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, sums


def eval_step(
    params: PyTree, batch: Batch, *, model: Transformer, label_smoothing: float
) -> dict[str, Array]:
    """Summed loss / NLL / correct / token counts of one evaluation batch (no dropout)."""
    _, sums = _loss_sums(params, batch, model, label_smoothing, None)
    return sums


# ---------------------------------------------------------------------------------------------
# Parallelism.


def make_mesh(model_parallelism: int = 1, devices=None) -> jax.sharding.Mesh:
    """A ('data', 'model') mesh over the local devices, with Auto axis types.

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


def _partition_spec(path, leaf) -> P:
    """Parameter (and matching optimizer-state) layout on the 'model' axis.

    Heads are independent until the output projection, so q/k/v kernels [D, N, H] split on N
    and the output kernel [N, H, D] on N; the FFN splits on d_ff. Everything else replicates.
    """
    names = [getattr(k, 'key', getattr(k, 'name', None)) for k in path]
    if getattr(leaf, 'ndim', 0) == 0 or len(names) < 2:
        return P()
    module, kind = names[-2], names[-1]
    if kind == 'kernel' and module in ('query', 'key', 'value'):
        return P(None, 'model', None)
    if kind == 'kernel' and module == 'out':
        return P('model', None, None)
    if module == 'wi':
        return P(None, 'model') if kind == 'kernel' else P('model')
    if module == 'wo' and kind == 'kernel':
        return P('model', None)
    return P()


def state_shardings(mesh: jax.sharding.Mesh, abstract_state: PyTree) -> PyTree:
    """NamedShardings for every leaf of the train state (see `_partition_spec`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, _partition_spec(path, leaf)), abstract_state
    )


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
            train_step,
            model=model,
            tx=tx,
            schedule=schedule,
            label_smoothing=label_smoothing,
            accum_steps=accum_steps,
        )
        self._eval = jax.jit(
            functools.partial(eval_step, model=model, label_smoothing=label_smoothing)
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
        return jax.device_put(state, state_shardings(self.mesh, state))

    def get_state(self, state: TrainState) -> TrainState:
        """The mode's layout -> one global copy (for checkpoints and evaluation)."""
        if self.mode == 'pmap':
            return jax.tree.map(lambda x: x[0], state)
        return state

    def put_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, Array]:
        n = self.num_data_shards
        rows = next(iter(batch.values())).shape[0]
        if rows % n:
            raise ValueError(f'Batch of {rows} rows does not split over {n} devices.')
        if self.mode == 'pmap':
            return {k: v.reshape(n, rows // n, *v.shape[1:]) for k, v in batch.items()}
        return jax.device_put(dict(batch), self._batch_sharding)

    def train_step(self, state: TrainState, batch: Batch, rng: Array):
        return self._step(state, self.put_batch(batch), rng)

    def eval_step(self, params: PyTree, batch: Batch) -> dict[str, Array]:
        return self._eval(params, batch)


# ---------------------------------------------------------------------------------------------
# Set-up and checkpoints.


def build_model(config: ml_collections.ConfigDict, vocab_size: int) -> Transformer:
    """The Transformer of ``config.model`` with the tokenizer's vocabulary size."""
    if config.model.max_len < config.data.max_len:
        raise ValueError(
            f'model.max_len={config.model.max_len} is below data.max_len={config.data.max_len}.'
        )
    return Transformer(config_from_dict(config.model, vocab_size))


def init_state(
    model: Transformer, tx: optax.GradientTransformation, rng: Array, max_len: int
) -> TrainState:
    """Random parameters (Glorot kernels, N(0, D^-1/2) embeddings) and a fresh optimizer."""
    dummy = jnp.ones((1, max_len), jnp.int32)

    @jax.jit
    def init(rng):
        params = model.init(rng, dummy, dummy)['params']
        return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))

    return init(rng)


def checkpoint_manager(workdir: str, config: ml_collections.ConfigDict) -> ocp.CheckpointManager:
    """``workdir/checkpoints``: params, optimizer state and a JSON of step + data state."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max(config.train.keep_checkpoints, config.eval.average_last),
        enable_async_checkpointing=config.train.async_checkpointing,
        create=True,
    )
    return ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), 'checkpoints'),
        options=options,
        item_names=('params', 'opt_state', 'meta'),
    )


def save_checkpoint(
    manager: ocp.CheckpointManager, state: TrainState, data_state: Mapping[str, Any], seed: int
) -> None:
    """Saves global (not per-device) arrays; ``meta`` holds what resuming needs besides."""
    step = int(state.step)
    meta = {'step': step, 'data_state': dict(data_state), 'seed': seed}
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(state.opt_state),
            meta=ocp.args.JsonSave(meta),
        ),
    )


def restore_checkpoint(
    manager: ocp.CheckpointManager, step: int, abstract_state: TrainState
) -> tuple[TrainState, dict[str, Any]]:
    """Restores the train state (into the given abstract tree) and the ``meta`` JSON."""
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_state.params),
            opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
            meta=ocp.args.JsonRestore(),
        ),
    )
    state = TrainState(
        step=jnp.array(restored['meta']['step'], jnp.int32),
        params=restored['params'],
        opt_state=restored['opt_state'],
    )
    return state, restored['meta']


def abstract_tree(tree: PyTree) -> PyTree:
    """Shapes, dtypes and shardings of ``tree``, for restoring into the same layout."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


# ---------------------------------------------------------------------------------------------
# Logging.


class MetricWriter:
    """Metrics to ``workdir/metrics.jsonl`` and TensorBoard event files (process 0 only)."""

    def __init__(self, workdir: str, enabled: bool):
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')  # noqa: SIM115
        import tensorflow as tf  # TensorBoard event files; imported lazily (slow import).

        self._tf = tf
        self._tb = tf.summary.create_file_writer(os.path.join(workdir, 'tensorboard'))

    def write(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        record = {'step': step, 'split': split, **{k: float(v) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(record) + '\n')
        self._jsonl.flush()
        with self._tb.as_default(step=step):
            for key, value in metrics.items():
                self._tf.summary.scalar(f'{split}/{key}', float(value))
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def _format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{secs:02d}s'


# ---------------------------------------------------------------------------------------------
# The loop.


def evaluate_loss(
    parallel: Parallel, params: PyTree, batches: list[Mapping[str, np.ndarray]]
) -> dict[str, float]:
    """Summed validation loss / NLL / accuracy over every evaluation batch."""
    totals: dict[str, float] = {}
    for batch in batches:
        sums = parallel.eval_step(params, {'inputs': batch['inputs'], 'targets': batch['targets']})
        for key, value in jax.device_get(sums).items():
            totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def validation_bleu(
    config: ml_collections.ConfigDict,
    tokenizer: data_lib.Tokenizer,
    model: Transformer,
    params: PyTree,
    workdir: str,
) -> dict[str, float]:
    """BLEU of the validation split (or its first ``eval.bleu_max_examples`` sentences),
    decoded and scored exactly as ``transformer.evaluate`` does."""
    scores, _ = evaluate.evaluate_split(
        config,
        tokenizer,
        model,
        params,
        config.data.eval_split,
        beam_size=config.eval.beam_size,
        alpha=config.eval.alpha,
        extra_length=config.eval.extra_length,
        batch_size=config.eval.batch_size,
        max_examples=config.eval.bleu_max_examples,
        workdir=workdir,
    )
    return {key: scores[key] for key in ('sacrebleu', 'tokenized_bleu', 'chrf')}


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    devices=None,
    on_step: Callable[[int, dict], None] | None = None,
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, resuming from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval).
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the local devices to use (default: all).
      on_step: optional callback (step, metrics) after every logged step (tests use it).

    Returns:
      The final train and validation metrics and the wall time.
    """
    start_time = time.time()
    tc = config.train
    if tc.distributed:
        jax.distributed.initialize()
    is_main = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)
    tokenizer = data_lib.get_tokenizer(config.data, workdir)
    model = build_model(config, tokenizer.vocab_size)
    tx, schedule = optim.make_optimizer(config.opt, config.model.d_model)
    parallel = Parallel.from_config(config, model, tx, schedule, devices)
    rows_needed = parallel.num_data_shards * tc.grad_accum_steps * jax.process_count()
    if tc.batch_size % rows_needed:
        raise ValueError(
            f'train.batch_size={tc.batch_size} must be a multiple of devices x grad_accum_steps '
            f'x processes = {rows_needed}.'
        )

    rng = jax.random.key(tc.seed)
    init_rng, dropout_rng = jax.random.split(rng)
    state = init_state(model, tx, init_rng, config.data.max_len)
    train_iter = data_lib.make_train_iterator(
        config.data,
        tokenizer,
        batch_size=tc.batch_size,
        seed=tc.seed,
        workdir=workdir,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    manager = checkpoint_manager(workdir, config)
    latest = manager.latest_step()
    if latest is not None:
        try:
            state, meta = restore_checkpoint(manager, latest, abstract_tree(state))
        except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise TrainingError(
                f'The checkpoint at step {latest} in {workdir}/checkpoints does not fit this '
                f'config (model or optimizer changed?): {first_line}. Resume with the config '
                'the run was started with, or use a new --workdir.'
            ) from None
        train_iter.set_state(meta['data_state'])
        logging.info('Resumed from %s at step %d.', workdir, latest)
    if is_main:
        # Written once the config is known to fit the checkpoints, so that a mistaken resume
        # never overwrites the description of what is saved.
        with open(os.path.join(workdir, 'config.json'), 'w') as f:
            f.write(config.to_json_best_effort(indent=2))
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    logging.info(
        'Model: %s parameters, %s; %s mode over %d devices.',
        f'{num_params:,}',
        model.config,
        tc.parallelism,
        len(parallel.devices),
    )
    eval_batches = data_lib.make_eval_batches(
        config.data,
        tokenizer,
        config.data.eval_split,
        batch_size=config.eval.batch_size,
        workdir=workdir,
    )

    writer = MetricWriter(workdir, enabled=is_main)
    state = parallel.put_state(state)
    step = int(parallel.get_state(state).step)
    first_step = step
    train_sums: dict[str, float] = {}
    last_log_time, last_log_step = time.time(), step
    final: dict[str, Any] = {}
    last_good_step = latest

    while step < tc.num_steps:
        batch = next(train_iter)
        state, sums = parallel.train_step(state, batch, dropout_rng)
        step += 1
        if tc.parallelism == 'pmap':
            sums = {k: v[0] for k, v in sums.items()}  # identical on every device
        is_log = step % tc.log_every == 0 or step == tc.num_steps
        is_ckpt = step % tc.checkpoint_every == 0 or step == tc.num_steps
        is_eval = (tc.eval_every and step % tc.eval_every == 0) or step == tc.num_steps
        sums = jax.device_get(sums) if (is_log or is_ckpt) else sums
        if is_log or is_ckpt:
            if not (np.isfinite(sums['loss']) and np.isfinite(sums['grad_norm'])):
                manager.wait_until_finished()
                kept = f'step {last_good_step}' if last_good_step is not None else 'none'
                raise TrainingError(
                    f'Non-finite loss or gradient at step {step} (loss={sums["loss"]}, '
                    f'grad_norm={sums["grad_norm"]}); stopped. Last good checkpoint: {kept} in '
                    f'{workdir}/checkpoints. Lower opt.lr_scale or raise opt.warmup_steps.'
                )
        for key in ('loss', 'nll', 'correct', 'tokens', 'source_tokens'):
            train_sums[key] = train_sums.get(key, 0.0) + sums[key]
        if is_log:
            now = time.time()
            metrics = summarize(
                {**train_sums, 'grad_norm': sums['grad_norm']},
                tokenizer.vocab_size,
                tc.label_smoothing,
            )
            metrics['learning_rate'] = float(sums['learning_rate'])
            elapsed = now - last_log_time
            steps_per_s = (step - last_log_step) / max(elapsed, 1e-9)
            metrics['steps_per_s'] = steps_per_s
            metrics['tokens_per_s'] = (
                float(train_sums['tokens']) + float(train_sums['source_tokens'])
            ) / max(elapsed, 1e-9)
            eta = (tc.num_steps - step) / max(steps_per_s, 1e-9)
            logging.info(
                'step %d/%d  loss %.4f  nll %.4f  acc %.3f  lr %.3g  %.2f steps/s  '
                '%s tokens/s  ETA %s',
                step,
                tc.num_steps,
                metrics['loss'],
                metrics['nll'],
                metrics['accuracy'],
                metrics['learning_rate'],
                steps_per_s,
                f'{metrics["tokens_per_s"]:,.0f}',
                _format_duration(eta),
            )
            writer.write(step, 'train', metrics)
            final['train'] = metrics
            if on_step is not None:
                on_step(step, metrics)
            train_sums = {}
            last_log_time, last_log_step = time.time(), step
        if is_eval:
            params = parallel.get_state(state).params
            metrics = summarize(
                evaluate_loss(parallel, params, eval_batches),
                tokenizer.vocab_size,
                tc.label_smoothing,
            )
            logging.info(
                'step %d  validation loss %.4f  nll %.4f  perplexity %.2f  accuracy %.4f',
                step,
                metrics['loss'],
                metrics['nll'],
                metrics['perplexity'],
                metrics['accuracy'],
            )
            writer.write(step, 'validation', metrics)
            final['validation'] = metrics
        bleu_every = config.eval.bleu_every
        if bleu_every and (step % bleu_every == 0 or step == tc.num_steps):
            final['validation_bleu'] = validation_bleu(
                config, tokenizer, model, parallel.get_state(state).params, workdir
            )
            logging.info('step %d  validation %s', step, final['validation_bleu'])
            writer.write(step, 'validation', final['validation_bleu'])
        if is_ckpt:
            save_checkpoint(manager, parallel.get_state(state), train_iter.get_state(), tc.seed)
            last_good_step = step
    manager.wait_until_finished()
    writer.close()
    final['step'] = step
    final['steps_this_run'] = step - first_step
    final['wall_time_s'] = time.time() - start_time
    final['num_params'] = num_params
    if is_main:
        with open(os.path.join(workdir, 'final_metrics.json'), 'w') as f:
            json.dump(final, f, indent=2)
    return final


def cli(argv: list[str] | None = None) -> None:
    """``python train.py --config configs/X.py --workdir DIR`` (also ``transformer-train``)."""
    from absl import flags
    from ml_collections import config_flags

    console.define_flag(
        'config',
        config_flags.DEFINE_config_file,
        None,
        'Experiment config file, e.g. configs/base.py.',
        lock_config=True,
    )
    console.define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')

    def main(_):
        console.require('config', 'workdir')
        try:
            final = train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
        except (TrainingError, data_lib.DataError, ValueError) as e:
            raise SystemExit(f'error: {e}') from None
        logging.info('Done: %s', json.dumps(final))

    console.run(main, argv)
