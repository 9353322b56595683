"""Learning-rate schedule and optimiser of the paper (Sec. 5.3), as an optax chain; fairseq's
inverse_sqrt schedule beside it; decoupled weight decay (AdamW) as an option.

``opt.weight_decay`` > 0 turns Adam into AdamW (Loshchilov & Hutter, ICLR 2019, "Decoupled
Weight Decay Regularization"): each update also subtracts lr x weight_decay x the parameter,
outside Adam's normalisation, as PyTorch's and fairseq's AdamW do (the decay follows the
schedule). Only the weight matrices decay (`decays`: parameters of two or more axes): the
attention, feed-forward and output kernels and the embedding table, which the output layer
shares (Sec. 3.4), so it is a weight matrix of the network like the others. Biases (one axis,
the attention's [N, H], T5's relative position bias [buckets, N]: every leaf named 'bias')
and layer-norm scales and offsets do not: they set offsets and scales, not how much a layer
responds to its input, so shrinking them towards 0 constrains nothing useful and pulls a layer
norm's gain towards a dead layer; leaving them out is BERT's and GPT-2's convention as well.

``model.logits_bias``'s parameter, Hugging Face MarianMT's ``final_logits_bias``, is a buffer
there that no optimizer updates: here it stays as it is too (`fixing_logits_bias`) unless
``opt.train_logits_bias``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from transformer.model import STACKED_KEYS
from transformer.schema import SCHEDULES


def rsqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (Sec. 5.3, Eq. 3).

    Linear warm-up for ``warmup_steps`` steps, then decay proportional to the inverse square
    root of the step. ``step`` counts from 1 at the first update (optax's count starts at 0),
    so the first update is not taken with a learning rate of 0.

    Args:
      d_model: the model width D.
      warmup_steps: the paper's warmup_steps (4000).
      scale: a constant factor; 1.0 is the paper.

    Returns:
      An optax schedule: update count (0-based) -> learning rate.
    """
    if warmup_steps <= 0:
        raise ValueError(f'opt.warmup_steps must be positive, got {warmup_steps}.')

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * float(warmup_steps) ** -1.5)

    return schedule


def inverse_sqrt_schedule(peak: float, warmup_steps: int, init: float = 0.0) -> optax.Schedule:
    """fairseq's ``inverse_sqrt`` (fairseq/optim/lr_scheduler/inverse_square_root_schedule.py).

    A linear warm-up from ``init`` (fairseq's ``--warmup-init-lr``, 1e-7 in its recipes) to
    ``peak`` (``--lr``) over ``warmup_steps`` updates, then ``peak * sqrt(warmup_steps /
    count)``. ``count`` is the number of updates already taken, optax's count and fairseq's
    ``num_updates`` alike: the first update uses ``init``, the update after ``warmup_steps``
    updates the peak (the two pieces meet there), and the rate halves by 4 x warmup_steps.
    Unlike 'rsqrt' the peak is the rate itself, not a factor on d_model^-0.5.

    Args:
      peak: the learning rate at the end of the warm-up (``opt.lr_scale``).
      warmup_steps: updates of the warm-up.
      init: the learning rate of the first update (``opt.warmup_init_lr``).

    Returns:
      An optax schedule: update count (0-based) -> learning rate.
    """
    if warmup_steps <= 0:
        raise ValueError(f'opt.warmup_steps must be positive, got {warmup_steps}.')

    def schedule(count):
        count = jnp.asarray(count, jnp.float32)
        warming = init + count * (peak - init) / warmup_steps
        decaying = peak * jnp.sqrt(warmup_steps / jnp.maximum(count, 1.0))
        return jnp.where(count < warmup_steps, warming, decaying)

    return schedule


def with_cooldown(schedule: optax.Schedule, num_steps: int, cooldown_steps: int) -> optax.Schedule:
    """``schedule`` times a linear ramp to zero over the last ``cooldown_steps`` of ``num_steps``.

    The factor is ``min(1, (num_steps - count) / cooldown_steps)``: 1 until the cool-down
    starts, ``1 / cooldown_steps`` at the last update (count ``num_steps - 1``).
    """
    if not 0 < cooldown_steps <= num_steps:
        raise ValueError(
            f'opt.cooldown_steps must be in [1, train.num_steps={num_steps}], got {cooldown_steps}.'
        )

    def cooled(count):
        remaining = num_steps - jnp.asarray(count, jnp.float32)
        return schedule(count) * jnp.clip(remaining / cooldown_steps, 0.0, 1.0)

    return cooled


def make_schedule(opt: Any, d_model: int, num_steps: int | None = None) -> optax.Schedule:
    """The schedule named by ``opt.schedule`` ('rsqrt', the paper; 'constant'; 'inverse_sqrt',
    fairseq's), with the linear cool-down of ``opt.cooldown_steps`` (0 = none) ending at
    ``num_steps``."""
    if opt.schedule == 'rsqrt':
        schedule = rsqrt_schedule(d_model, opt.warmup_steps, opt.lr_scale)
    elif opt.schedule == 'inverse_sqrt':
        schedule = inverse_sqrt_schedule(opt.lr_scale, opt.warmup_steps, opt.warmup_init_lr)
    elif opt.schedule == 'constant':
        schedule = optax.constant_schedule(opt.lr_scale)
    else:
        raise ValueError(f'opt.schedule must be one of {SCHEDULES}, got {opt.schedule!r}.')
    cooldown_steps = opt.cooldown_steps
    if not cooldown_steps:
        return schedule
    if num_steps is None:
        raise ValueError('opt.cooldown_steps needs the run length (train.num_steps).')
    return with_cooldown(schedule, num_steps, cooldown_steps)


def decays(params: Any) -> Any:
    """The weight-decay mask of ``params``: True for weight matrices (two or more axes), False
    for biases (the attention's [N, H] ones and T5's [buckets, N] too) and layer-norm
    parameters (module docstring)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, p: p.ndim - _stacked(path) >= 2 and _name(path) != 'bias', params
    )


def _stacked(path: tuple[Any, ...]) -> int:
    """1 for a leaf of a scanned model's stacked layers (their leading layer axis,
    transformer/model/layer_stack.py), else 0."""
    return int(bool(path) and getattr(path[0], 'key', None) in STACKED_KEYS)


def _name(path: tuple[Any, ...]) -> Any:
    """The key of a tree path's last entry (a dict's key; None for a list's index)."""
    return getattr(path[-1], 'key', None) if path else None


# The parameter of model.logits_bias (transformer/model/output_head.py): Hugging Face's
# final_logits_bias, a buffer never trained there.
FIXED_UNLESS_TRAINED = 'logits_bias'


def _without_fixed(tree: Any) -> Any:
    """``tree`` with zeros at the top-level entry `FIXED_UNLESS_TRAINED`, where it has one."""
    if not isinstance(tree, Mapping) or FIXED_UNLESS_TRAINED not in tree:
        return tree
    return type(tree)({**tree, FIXED_UNLESS_TRAINED: jnp.zeros_like(tree[FIXED_UNLESS_TRAINED])})


def fixing_logits_bias(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``inner`` with the logits' bias left as it is: its gradient is zero before ``inner``
    (so global-norm clipping and Adam's moments never see it, as Hugging Face computes none
    for its buffer) and its update zero after. The state is ``inner``'s own, the same for
    trees with and without the parameter, so checkpoints of earlier runs restore."""

    def update(updates, state, params=None):
        updates, state = inner.update(_without_fixed(updates), state, params)
        return _without_fixed(updates), state

    return optax.GradientTransformation(inner.init, update)


def make_optimizer(
    opt: Any, d_model: int, num_steps: int | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam(beta1, beta2, eps) on the schedule, optionally after global-norm clipping; AdamW on
    the weight matrices (`decays`) when ``opt.weight_decay`` > 0; the logits' bias
    (``model.logits_bias``) fixed unless ``opt.train_logits_bias`` (`fixing_logits_bias`).

    Args:
      opt: the config's ``opt`` section (schedule, warmup_steps, lr_scale, warmup_init_lr,
        cooldown_steps, b1, b2, eps, clip_grad_norm, weight_decay, train_logits_bias).
      d_model: the model width D (the schedule depends on it).
      num_steps: the run length, where the cool-down ends (needed when it is on).

    Returns:
      The optax transformation and its schedule (for logging the learning rate).
    """
    schedule = make_schedule(opt, d_model, num_steps)
    chain = []
    if opt.clip_grad_norm:
        chain.append(optax.clip_by_global_norm(opt.clip_grad_norm))
    if opt.weight_decay:
        chain.append(
            optax.adamw(
                schedule,
                b1=opt.b1,
                b2=opt.b2,
                eps=opt.eps,
                weight_decay=opt.weight_decay,
                mask=decays,
            )
        )
    else:  # Adam's own state layout, which checkpoints of earlier runs hold
        chain.append(optax.adam(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps))
    tx = optax.chain(*chain)
    if not opt.train_logits_bias:
        tx = fixing_logits_bias(tx)
    return tx, schedule
