"""The token embedding lookup and the ways to compute its gradient (``model.embedding_grad``).

The lookup is a gather of rows of the [V, D] embedding (Sec. 3.4); every variant gathers the
same rows forward and differs only in how the [B, T, D] cotangent is summed into the [V, D]
gradient, the same sums in another order:

- 'scatter': autodiff's scatter-add. GPUs run it with atomic adds that collide on frequent
  tokens (EOS, 'the').
- 'one_hot': one-hot(tokens)^T @ cotangent, a matrix product over blocks of tokens so that the
  one-hot [tokens, V] block stays small; no scatter in the compiled HLO, 2 N V D multiply-adds
  on the matrix units.
- 'sorted_scatter': the tokens sorted first, then a segment sum told its indices are sorted, so
  that equal tokens are neighbours and no two threads add into one row at once.
- 'auto': the measured winner for the backend (`backends.platform.WINNERS`).

The sums run in float32 (a bfloat16 cotangent times the exact one-hot, accumulated in float32,
loses nothing); benchmarks/README.md ("Step variants") has the timings that chose 'auto'.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer import backends

Array = jax.Array
# Tokens per one-hot block of the 'one_hot' gradient: its one-hot block is
# GRAD_BLOCK_TOKENS x V (2048 x 37k bfloat16 = 150 MB at the WMT vocabulary).
GRAD_BLOCK_TOKENS = 2048
EMBEDDING_GRADS = ('auto', 'scatter', 'one_hot', 'sorted_scatter')


def take_lookup(embedding: Array, tokens: Array, dtype) -> Array:
    """Rows ``embedding[tokens]`` [..., D] in ``dtype``; autodiff's gradient is a scatter-add.

    Gathers in the parameter dtype and casts the gathered rows (not the whole table), so the
    gradient accumulates in the parameter dtype.
    """
    return jnp.take(embedding, tokens, axis=0).astype(dtype)


def _one_hot_sum(ids: Array, g: Array, vocab: int) -> Array:
    """sum_i one_hot(ids_i) g_i as [V, D] float32, in blocks of GRAD_BLOCK_TOKENS tokens."""
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
    return jax.lax.scan(add_block, zeros, (ids, g))[0]


def _sorted_sum(ids: Array, g: Array, vocab: int) -> Array:
    """sum_i one_hot(ids_i) g_i as [V, D] float32 by a segment sum over sorted ids."""
    order = jnp.argsort(ids)
    return jax.ops.segment_sum(
        g[order].astype(jnp.float32), ids[order], num_segments=vocab, indices_are_sorted=True
    )


_SUMS = {'one_hot': _one_hot_sum, 'sorted_scatter': _sorted_sum}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def custom_grad_lookup(embedding: Array, tokens: Array, dtype, grad: str) -> Array:
    """`take_lookup` whose gradient is summed by ``grad`` ('one_hot' or 'sorted_scatter')."""
    return take_lookup(embedding, tokens, dtype)


def _custom_fwd(embedding: Array, tokens: Array, dtype, grad: str):
    # The table is a parameter, alive anyway: keeping it costs nothing and gives V and dtype.
    return take_lookup(embedding, tokens, dtype), (embedding, tokens)


def _custom_bwd(dtype, grad: str, residuals, g: Array):
    embedding, tokens = residuals
    ids = jnp.asarray(tokens).reshape(-1)
    total = _SUMS[grad](ids, g.reshape(-1, g.shape[-1]), embedding.shape[0])
    return total.astype(embedding.dtype), None


custom_grad_lookup.defvjp(_custom_fwd, _custom_bwd)


def lookup(embedding: Array, tokens: Array, dtype, grad: str = 'auto') -> Array:
    """Embedding rows [..., D] of ``tokens`` [...] in ``dtype``: the same gather forward, and
    the gradient ``grad`` names (one of EMBEDDING_GRADS; module docstring)."""
    grad = backends.embedding_grad(grad)
    if grad == 'scatter':
        return take_lookup(embedding, tokens, dtype)
    if grad not in _SUMS:
        raise ValueError(f'model.embedding_grad={grad!r} must be one of {EMBEDDING_GRADS}')
    return custom_grad_lookup(embedding, tokens, dtype, grad)
