"""R-Drop (Liang et al., NeurIPS 2021, "R-Drop: Regularized Dropout for Neural Networks"): each
batch passes through the network twice with independent dropout masks, and the two output
distributions are pulled together.

With p1, p2 the two passes' softmax over the vocabulary at a target position, the loss of a
batch is (``train.rdrop_alpha`` = alpha)

    (CE_1 + CE_2) / 2 + alpha x 0.5 x (KL(p1 || p2) + KL(p2 || p1)),

each term summed over the real (non-padding) target tokens and divided by their number as the
plain loss is (transformer/training/steps.py), CE being the label-smoothed cross-entropy. This is
the paper's Eq. 3 halved: the paper sums the two cross-entropies, so its alpha is twice this
one (its IWSLT'14 alpha = 5 is 2.5 here; Adam is almost blind to the overall factor). The
symmetric KL is 0.5 x sum_v (p1_v - p2_v)(log p1_v - log p2_v); the gradient flows into both
passes, as in the paper's code.

The second pass is one more call of the same forward with another dropout key, derived from the
step's own (`second_pass_key`): a function of (seed, step, micro-batch, device) like the first,
so a resumed run draws both masks again. The first pass keeps the key a plain step uses.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

Array = jax.Array

KL_KEY = 'rdrop_kl'  # the symmetric KL's sum among a step's metric sums
# Folded into the step's dropout key for the second pass: any constant does; this one spells
# 'RDRP'. Micro-batches and devices fold their index into the key *before* the passes split.
_SECOND_PASS = 0x52445250


def second_pass_key(rng: Array) -> Array:
    """The second pass's dropout key, a pure function of the first's."""
    return jax.random.fold_in(rng, _SECOND_PASS)


@jax.custom_vjp
def symmetric_kl(logits_1: Array, logits_2: Array) -> Array:
    """0.5 x (KL(p1 || p2) + KL(p2 || p1)) at every position of logits [..., V], float32 [...].

    Written as 0.5 x sum_v (p1 - p2)(log p1 - log p2), from log-softmaxes (finite for any
    finite logits; each term is >= 0). The gradient is written out (`_kl_bwd`) from the two
    logits alone, which the cross-entropy keeps anyway: autodiff kept four more [..., V] arrays
    (both log-softmaxes and both softmaxes), the step's largest.
    """
    return _kl_fwd(logits_1, logits_2)[0]


def _log_softmaxes(logits_1: Array, logits_2: Array) -> tuple[Array, Array]:
    return (
        jax.nn.log_softmax(logits_1.astype(jnp.float32), axis=-1),
        jax.nn.log_softmax(logits_2.astype(jnp.float32), axis=-1),
    )


def _kl_fwd(logits_1: Array, logits_2: Array):
    log_p1, log_p2 = _log_softmaxes(logits_1, logits_2)
    kl = 0.5 * ((jnp.exp(log_p1) - jnp.exp(log_p2)) * (log_p1 - log_p2)).sum(axis=-1)
    return kl, (logits_1, logits_2)


def _kl_bwd(residuals, g: Array):
    """With d = log p1 - log p2 (and sum_v (p1 - p2) = 0): d KL / d z1 = 0.5 (p1 (d - <p1, d>)
    + p1 - p2) and d KL / d z2 = 0.5 (p2 (<p2, d> - d) + p2 - p1)."""
    logits_1, logits_2 = residuals
    log_p1, log_p2 = _log_softmaxes(logits_1, logits_2)
    p1, p2, d = jnp.exp(log_p1), jnp.exp(log_p2), log_p1 - log_p2
    g = 0.5 * g[..., None]
    grad_1 = g * (p1 * (d - (p1 * d).sum(-1, keepdims=True)) + p1 - p2)
    grad_2 = g * (p2 * ((p2 * d).sum(-1, keepdims=True) - d) + p2 - p1)
    return grad_1.astype(logits_1.dtype), grad_2.astype(logits_2.dtype)


symmetric_kl.defvjp(_kl_fwd, _kl_bwd)


def combine(
    first: Mapping[str, Array], second: Mapping[str, Array], kl_sum: Array, alpha: float
) -> tuple[Array, dict[str, Array]]:
    """The objective (summed) and the metric sums of the two passes.

    ``first`` / ``second`` hold each pass's sums ('loss', 'nll', 'correct', 'tokens'); the
    metrics are their means (so 'loss' reads as a plain run's, the KL apart), with the KL's sum
    under `KL_KEY`. The objective is mean loss + alpha x KL.
    """
    means = [key for key in first if key != 'tokens']  # the z-loss's too, where it is on
    sums = {key: 0.5 * (first[key] + second[key]) for key in means}
    sums['tokens'] = first['tokens']
    sums[KL_KEY] = kl_sum
    return sum(sums[key] for key in means if key not in ('nll', 'correct')) + alpha * kl_sum, sums
