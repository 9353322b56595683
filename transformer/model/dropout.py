"""Inverted dropout whose keep mask costs 16 random bits an element instead of 32.

flax's ``nn.Dropout`` draws a uniform float32 (32 random bits) for every element and compares
it with the keep probability. Generating the random bits is most of dropout's cost on CPU
(docs/experiments.md), so here every 32-bit draw is split into two 16-bit halves, each
the keep decision of one element: ``keep = half >= round(rate * 2^16)``. The drop probability
is therefore ``rate`` rounded to a multiple of 2^-16 (0.1 -> 6554 / 2^16 = 0.1000061;
0.3 -> 19661 / 2^16 = 0.3000031), and kept values are scaled by the inverse of the realised
keep probability, so E[output] == input. The scaling is done in float32 whatever the
activations' dtype: a bfloat16 scale would be rounded (rate 0.1: 1.109375 for 1.111111, a
0.998x bias on every activation); each product is rounded to bfloat16 once, to nearest.
Masks are a pure function of the 'dropout' rng as in flax: deterministic per seed and step,
so resuming stays exact.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

_LEVELS = 1 << 16  # a 16-bit half takes 2^16 values


def drop_threshold(rate: float) -> int:
    """The 16-bit threshold below which an element is dropped: round(rate * 2^16)."""
    return round(rate * _LEVELS)


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    """A boolean mask of ``shape`` whose elements are True with probability ~(1 - rate)."""
    if not shape:
        return keep_mask(key, (1,), rate)[0]
    last = shape[-1]
    # Two elements of the last axis share one uint32 draw (its low and high 16-bit halves).
    bits = jax.random.bits(key, (*shape[:-1], math.ceil(last / 2)), jnp.uint32)
    halves = jax.lax.bitcast_convert_type(bits, jnp.uint16)  # [..., ceil(last / 2), 2]
    halves = halves.reshape(*shape[:-1], -1)[..., :last]
    return halves >= jnp.uint16(drop_threshold(rate))


class Dropout(nn.Module):
    """Inverted dropout (Sec. 5.4's P_drop) with 16-bit keep decisions; see the module doc.

    Attributes:
      rate: drop probability, in [0, 1).
    """

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        threshold = drop_threshold(self.rate)
        if deterministic or threshold == 0:
            return x
        keep = keep_mask(self.make_rng('dropout'), x.shape, self.rate)
        scale = jnp.float32(_LEVELS / (_LEVELS - threshold))  # see the module docstring
        kept = (x.astype(jnp.float32) * scale).astype(x.dtype)
        return jnp.where(keep, kept, jnp.zeros((), x.dtype))
