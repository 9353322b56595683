"""Learning-rate schedule and optimiser of the paper (Sec. 5.3), as an optax chain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import optax


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


def make_schedule(opt: Mapping[str, Any], d_model: int) -> optax.Schedule:
    """The schedule named by ``opt.schedule``: 'rsqrt' (the paper) or 'constant'."""
    if opt['schedule'] == 'rsqrt':
        return rsqrt_schedule(d_model, opt['warmup_steps'], opt['lr_scale'])
    if opt['schedule'] == 'constant':
        return optax.constant_schedule(opt['lr_scale'])
    raise ValueError(f"opt.schedule must be 'rsqrt' or 'constant', got {opt['schedule']!r}.")


def make_optimizer(
    opt: Mapping[str, Any], d_model: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam(beta1, beta2, eps) on the schedule, optionally after global-norm clipping.

    Args:
      opt: the config's ``opt`` section (schedule, warmup_steps, lr_scale, b1, b2, eps,
        clip_grad_norm).
      d_model: the model width D (the schedule depends on it).

    Returns:
      The optax transformation and its schedule (for logging the learning rate).
    """
    schedule = make_schedule(opt, d_model)
    chain = []
    if opt['clip_grad_norm']:
        chain.append(optax.clip_by_global_norm(opt['clip_grad_norm']))
    chain.append(optax.adam(schedule, b1=opt['b1'], b2=opt['b2'], eps=opt['eps']))
    return optax.chain(*chain), schedule
