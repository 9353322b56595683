"""The token embedding lookup, and a gradient for it that needs no scatter.

The lookup is a gather of rows of the [V, D] embedding (Sec. 3.4). Its gradient, by autodiff,
is a scatter-add of the [B, T, D] cotangent into a [V, D] zero matrix, which GPUs run with
atomic adds that collide on frequent tokens (EOS, 'the'); in a profile of the base step on an
H200 it was 9% of the kernel time. `scatter_free_lookup` writes the same gradient as
one-hot(tokens)^T @ cotangent, a matrix product over blocks of tokens so that the one-hot
[tokens, V] block stays small: the same sums in another order, and no scatter in the compiled
HLO. It costs 2 N V D multiply-adds, which a GPU's matrix units absorb and a CPU does not
(`platform.scatter_free_embedding_grad` chooses). In float32 the product follows jax's default
matmul precision, as every other product of the model does (TensorFloat-32 on recent NVIDIA
GPUs); a bfloat16 cotangent times the exact one-hot, accumulated in float32, loses nothing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.backends import platform

Array = jax.Array
# Tokens per one-hot block of the scatter-free gradient: its one-hot block is
# GRAD_BLOCK_TOKENS x V (2048 x 37k bfloat16 = 150 MB at the WMT vocabulary).
GRAD_BLOCK_TOKENS = 2048


def take_lookup(embedding: Array, tokens: Array, dtype) -> Array:
    """Rows ``embedding[tokens]`` [..., D] in ``dtype``; autodiff's gradient is a scatter-add.

    Gathers in the parameter dtype and casts the gathered rows (not the whole table), so the
    gradient accumulates in the parameter dtype.
    """
    return jnp.take(embedding, tokens, axis=0).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def scatter_free_lookup(embedding: Array, tokens: Array, dtype) -> Array:
    """`take_lookup` whose gradient is a blocked one-hot matrix product (module docstring)."""
    return take_lookup(embedding, tokens, dtype)


def _scatter_free_fwd(embedding: Array, tokens: Array, dtype):
    # The table is a parameter, alive anyway: keeping it costs nothing and gives V and dtype.
    return take_lookup(embedding, tokens, dtype), (embedding, tokens)


def _scatter_free_bwd(dtype, residuals, g: Array):
    embedding, tokens = residuals
    vocab = embedding.shape[0]
    g = g.reshape(-1, g.shape[-1])
    ids = tokens.reshape(-1)
    block = min(GRAD_BLOCK_TOKENS, ids.shape[0])
    pad = -ids.shape[0] % block
    # Padding ids equal V: their one-hot rows are all zero.
    ids = jnp.pad(ids, (0, pad), constant_values=vocab).reshape(-1, block)
    g = jnp.pad(g, ((0, pad), (0, 0))).reshape(-1, block, g.shape[-1])

    def add_block(total, xs):
        block_ids, block_g = xs
        one_hot = jax.nn.one_hot(block_ids, vocab, dtype=block_g.dtype)  # [block, V]
        return total + jnp.einsum(
            'CV,CD->VD', one_hot, block_g, preferred_element_type=jnp.float32
        ), None

    zeros = jnp.zeros((vocab, g.shape[-1]), jnp.float32)
    total, _ = jax.lax.scan(add_block, zeros, (ids, g))
    return total.astype(embedding.dtype), None


scatter_free_lookup.defvjp(_scatter_free_fwd, _scatter_free_bwd)


# The one place the implementation is chosen; backends not listed use `take_lookup`.
def lookup(embedding: Array, tokens: Array, dtype) -> Array:
    """Embedding rows [..., D] of ``tokens`` [...] in ``dtype``: the same gather forward, and
    a scatter-add or a scatter-free gradient as `platform.scatter_free_embedding_grad` says."""
    scatter_free = platform.scatter_free_embedding_grad()
    return (scatter_free_lookup if scatter_free else take_lookup)(embedding, tokens, dtype)
