"""What one training step computes: the train state, the label-smoothed loss, gradient
accumulation, and the train / eval steps (parallelism lives in transformer/training/parallel.py).

The loss is a *sum* over real target tokens; the step divides the summed gradient by the
number of real target tokens of the whole global batch, so any split of the batch (devices,
micro-batches, processes) computes the same update as one device holding all of it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from transformer import schema
from transformer.model import (
    Packing,
    Transformer,
    config_from_dict,
    hidden_and_projection,
    init_params,
    teacher_forced_logits,
)
from transformer.schema import DROPOUT_PRNGS
from transformer.training import rdrop
from transformer.training.loss import fused_cross_entropy, position_losses

Array = jax.Array
PyTree = Any
Batch = Mapping[str, Array]
SUM_KEYS = ('loss', 'nll', 'correct', 'tokens')
# The summed z-loss (train.z_loss > 0): beside 'loss', which stays the smoothed cross-entropy.
Z_LOSS_KEY = 'z_loss'


@struct.dataclass
class TrainState:
    """What a step changes. The dropout key is derived from (seed, step), so it needs no slot."""

    step: Array
    params: PyTree
    opt_state: PyTree


def build_model(config: schema.Experiment, vocab_size: int) -> Transformer:
    """The Transformer of ``config.model`` with the tokenizer's vocabulary size."""
    return Transformer(config_from_dict(config.model, vocab_size))


def init_state(
    model: Transformer, tx: optax.GradientTransformation, rng: Array, max_len: int
) -> TrainState:
    """Random parameters (Glorot kernels, N(0, D^-1/2) embeddings) and a fresh optimizer."""

    @jax.jit
    def init(rng):
        return fresh_state(tx, init_params(model, rng, max_len))

    return init(rng)


def fresh_state(tx: optax.GradientTransformation, params: PyTree) -> TrainState:
    """Step 0: ``params`` and a fresh optimizer state for them."""
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))


DEFAULT_DROPOUT_PRNG = DROPOUT_PRNGS[0]  # jax's default key


def dropout_key(seed: int, prng: str = DEFAULT_DROPOUT_PRNG) -> Array:
    """The run's base dropout key; each step folds in its step number (and device index).

    'threefry' is jax's default (and this package's original) key, the second half of
    ``split(key(seed))``. 'rbg' / 'unsafe_rbg' draw the masks with XLA's RngBitGenerator
    ('unsafe_rbg' also derives keys cheaply, as t5x and MaxText accept for dropout);
    'philox4x32' is jax's Philox counter-based generator, not compilable inside pmap in jax
    0.10.2 (its mulhi op under manual sharding). The whole training step is cheapest with
    threefry (docs/experiments.md, step_overhead.py), hence the default.
    All are functions of (seed, step) only, so a resumed run draws the same masks.
    """
    if prng not in DROPOUT_PRNGS:
        raise ValueError(f'train.dropout_prng must be one of {DROPOUT_PRNGS}, got {prng!r}.')
    if prng == 'threefry':
        return jax.random.split(jax.random.key(seed))[1]
    return jax.random.fold_in(jax.random.key(seed, impl=prng), 1)


def resumed_prng_warning(changes: Sequence[tuple[str, Any, Any]]) -> str | None:
    """One line for a resume whose ``changes`` (`run_changes.resume_changes`: key, old, new) switch
    the dropout PRNG: the masks from there on differ from an uninterrupted run's. None when
    the generator stays (a config.json written before the field existed reads as threefry,
    the generator such runs used)."""
    for key, saved, now in changes:
        if key == 'train.dropout_prng':
            return (
                f'This run was started with train.dropout_prng={saved!r} and resumes with '
                f'{now!r}: its dropout masks from here on differ from an uninterrupted run '
                f'(--config.train.dropout_prng={saved} keeps them).'
            )
    return None


def cross_entropy_with_smoothing(
    logits: Array,
    targets: Array,
    weights: Array,
    label_smoothing: float,
    z_loss: float = 0.0,
) -> tuple[Array, ...]:
    """Summed label-smoothed and plain cross-entropy over the weighted target positions
    (and with ``z_loss`` = C > 0 the summed z-loss C log(Z)^2, `loss.position_losses`).

    The smoothed target puts 1 - eps on the reference token and eps / (V - 1) on each other
    token (Sec. 5.4); `loss.token_losses` has the algebra, shared with the chunked loss.

    Args:
      logits: [B, T, V].
      targets: [B, T] token ids.
      weights: [B, T], 1 for real target tokens, 0 for padding.
      label_smoothing: eps_ls.
      z_loss: C; 0: none.

    Returns:
      (smoothed loss sum, NLL sum (, z-loss sum)), each a float32 scalar.
    """
    return tuple(
        (x * weights).sum() for x in position_losses(logits, targets, label_smoothing, z_loss)
    )


def smoothing_floor(vocab_size: int, label_smoothing: float) -> float:
    """The smallest possible smoothed loss per token: the entropy of the smoothed target."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    entropy = -confidence * math.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy -= (vocab_size - 1) * low * math.log(low)
    return entropy


def _pass_sums(
    params: PyTree,
    batch: Batch,
    model: Transformer,
    label_smoothing: float,
    rng: Array | None,
    loss_chunk_tokens: int,
    z_loss: float = 0.0,
) -> tuple[dict[str, Array], Array | None]:
    """One forward pass: its metric sums ('loss' the smoothed one; `Z_LOSS_KEY` the z-loss,
    with ``z_loss``) and its logits (None for the chunked loss, which never forms them). Its
    objective is 'loss' plus the z-loss (`objective`)."""
    args = (model, params, batch['inputs'], batch['targets'])
    kwargs = {'rng': rng, 'packing': Packing.of(batch)}
    weights = (batch['targets'] != model.config.special.pad).astype(jnp.float32)
    logits = None
    if loss_chunk_tokens:
        hidden, (weight, bias) = hidden_and_projection(*args, **kwargs)
        chunked = fused_cross_entropy(
            hidden,
            weight,
            bias,
            batch['targets'],
            weights,
            label_smoothing,
            loss_chunk_tokens,
            model.config.dtype,
            z_loss,
        )
        loss, nll, correct, z_sum = chunked if z_loss else (*chunked, None)
        if z_loss:  # the first sum is the objective, which carries the gradient: its z apart
            loss = loss - z_sum
    else:
        logits = teacher_forced_logits(*args, **kwargs)
        sums = cross_entropy_with_smoothing(
            logits, batch['targets'], weights, label_smoothing, z_loss
        )
        loss, nll, z_sum = sums if z_loss else (*sums, None)
        correct = ((logits.argmax(-1) == batch['targets']) * weights).sum()
    sums = {'loss': loss, 'nll': nll, 'correct': correct, 'tokens': weights.sum()}
    if z_loss:
        sums[Z_LOSS_KEY] = z_sum
    return sums, logits


def objective(sums: Mapping[str, Array]) -> Array:
    """What the step differentiates: the summed smoothed loss, plus the z-loss where it is
    on."""
    return sums['loss'] + sums[Z_LOSS_KEY] if Z_LOSS_KEY in sums else sums['loss']


def loss_sums(
    params: PyTree,
    batch: Batch,
    model: Transformer,
    label_smoothing: float,
    rng: Array | None,
    loss_chunk_tokens: int = 0,
    rdrop_alpha: float = 0.0,
    z_loss: float = 0.0,
) -> tuple[Array, dict[str, Array]]:
    """Summed smoothed loss of a batch (for the gradient; plus the z-loss, ``z_loss`` =
    train.z_loss > 0) and the sums its metrics need.

    ``loss_chunk_tokens`` (``train.loss_chunk_tokens``) > 0 computes them from the decoder's
    hidden states and the output projection in chunks of that many tokens, never forming the
    [B, T, V] logits (transformer/training/loss.py); 0 forms the logits.
    ``rdrop_alpha`` > 0 with an ``rng`` (training) adds R-Drop's second pass and its KL
    (transformer/training/rdrop.py); without an rng (validation) the loss is the plain one.
    """
    rdrop_on = bool(rdrop_alpha) and rng is not None
    if rdrop_on and loss_chunk_tokens:
        raise ValueError('train.rdrop_alpha needs the logits: set train.loss_chunk_tokens=0.')
    args = (params, batch, model, label_smoothing)
    sums, logits = _pass_sums(*args, rng, loss_chunk_tokens, z_loss)
    if not rdrop_on:
        return objective(sums), sums
    second, logits_2 = _pass_sums(*args, rdrop.second_pass_key(rng), 0, z_loss)
    weights = (batch['targets'] != model.config.special.pad).astype(jnp.float32)
    kl_sum = (rdrop.symmetric_kl(logits, logits_2) * weights).sum()
    return rdrop.combine(sums, second, kl_sum, rdrop_alpha)


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
    if Z_LOSS_KEY in sums:  # the z-loss per token, C included (train.z_loss)
        out[Z_LOSS_KEY] = float(sums[Z_LOSS_KEY]) / tokens
    if rdrop.KL_KEY in sums:  # R-Drop's symmetric KL per token, without its alpha
        out[rdrop.KL_KEY] = float(sums[rdrop.KL_KEY]) / tokens
    for key in ('grad_norm', 'learning_rate', 'source_tokens'):
        if key in sums:
            out[key] = float(sums[key])
    return out


def accumulated_grads(
    params: PyTree,
    batch: Batch,
    model: Transformer,
    label_smoothing: float,
    rng: Array,
    accum_steps: int,
    loss_chunk_tokens: int = 0,
    rdrop_alpha: float = 0.0,
    z_loss: float = 0.0,
) -> tuple[PyTree, dict[str, Array]]:
    """Gradient of the summed loss, accumulated over ``accum_steps`` micro-batches.

    Micro-batches are strided: row r goes to micro-batch r mod A. The batch's rows are split
    over the data devices in contiguous blocks, so every micro-batch keeps rows on every
    device: each device computes rows / (devices x A) rows at a time, which is what saves
    activation memory (contiguous micro-batches would each live on a fraction of the devices
    and make XLA gather them). Summing (not averaging) the gradients and the token counts
    keeps the normalisation by the total token count exact.
    """
    grad_fn = jax.grad(
        functools.partial(
            loss_sums, loss_chunk_tokens=loss_chunk_tokens, rdrop_alpha=rdrop_alpha, z_loss=z_loss
        ),
        has_aux=True,
    )
    if accum_steps == 1:
        return grad_fn(params, batch, model, label_smoothing, rng)
    micro = jax.tree.map(
        lambda x: jnp.swapaxes(x.reshape(-1, accum_steps, *x.shape[1:]), 0, 1), batch
    )

    def body(carry, xs):
        micro_batch, index = xs
        grads, sums = grad_fn(
            params, micro_batch, model, label_smoothing, jax.random.fold_in(rng, index)
        )
        return jax.tree.map(jnp.add, carry, (grads, sums)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    keys = (*SUM_KEYS, *([rdrop.KL_KEY] if rdrop_alpha else []), *([Z_LOSS_KEY] if z_loss else []))
    zero_sums = {k: jnp.zeros((), jnp.float32) for k in keys}
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
    loss_chunk_tokens: int = 0,
    rdrop_alpha: float = 0.0,
    z_loss: float = 0.0,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser step on the (local part of the) batch.

    Under ``pmap`` (``axis_name`` set) each device folds its index into the dropout key and
    the gradient and token sums are averaged over devices with ``pmean``: the ratio of the two
    means is the global token-normalised gradient. Under ``jit`` the batch is global already.
    """
    rng = jax.random.fold_in(base_rng, state.step)
    if axis_name is not None:
        rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    grads, sums = accumulated_grads(
        state.params,
        batch,
        model,
        label_smoothing,
        rng,
        accum_steps,
        loss_chunk_tokens,
        rdrop_alpha,
        z_loss,
    )
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
    source_tokens = (batch['inputs'] != model.config.special.pad).sum().astype(jnp.float32)
    sums['source_tokens'] = (
        jax.lax.psum(source_tokens, axis_name) if axis_name is not None else source_tokens
    )
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, sums


def eval_step(
    params: PyTree,
    batch: Batch,
    *,
    model: Transformer,
    label_smoothing: float,
    loss_chunk_tokens: int = 0,
    z_loss: float = 0.0,
) -> dict[str, Array]:
    """Summed loss / NLL / correct / token counts (and z-loss) of one evaluation batch (no
    dropout)."""
    _, sums = loss_sums(
        params, batch, model, label_smoothing, None, loss_chunk_tokens, z_loss=z_loss
    )
    return sums
