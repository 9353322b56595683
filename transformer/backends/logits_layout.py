"""The tied pre-softmax logits y E^T with their embedding gradient laid out for a CPU's matmul.

Autodiff writes the embedding's gradient as dE = dlogits^T y, and XLA's CPU matmul then copies
the whole [B*T, V] dlogits transposed (a Multi30k step's largest copy: docs/performance.md);
computing (y^T dlogits)^T transposes the small [B*T, D] and [D, V] arrays instead. The value
and the gradient are the same; only the layout of the work differs. Other backends take
autodiff's gradient (`platform.on_cpu`).
"""

from __future__ import annotations

import jax

from transformer.backends import platform, products

Array = jax.Array


def tied_logits(y: Array, embedding: Array) -> Array:
    """y E^T [B, T, V] of decoder outputs y [B, T, D] and the shared embedding E [V, D]."""
    if platform.on_cpu():
        return _cpu_tied_logits(y, embedding)
    return products.einsum('BTD,VD->BTV', y, embedding)


@jax.custom_vjp
def _cpu_tied_logits(y: Array, embedding: Array) -> Array:
    return products.einsum('BTD,VD->BTV', y, embedding)


def _forward(y: Array, embedding: Array):
    return _cpu_tied_logits(y, embedding), (y, embedding)


def _backward(residuals, g: Array):
    y, embedding = residuals
    dy = products.einsum('BTV,VD->BTD', g, embedding)
    d_embedding = products.einsum('BTD,BTV->DV', y, g).T
    return dy, d_embedding


_cpu_tied_logits.defvjp(_forward, _backward)
