"""Attention of one decoding step: a single query per row over the head-major caches
(transformer/model/cache.py), the paths `MultiHeadAttention` takes once its cache exists.

Shape legend (transformer/model/attention.py): B cache rows · R query rows · N heads · K
key/value heads · G query heads per key/value head · S cached positions · H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer.model import cache as cache_layout
from transformer.model.masks import masked_softmax

Array = jax.Array


def one_query(q: Array, k: Array, v: Array, mask: Array, bias: Array | None = None) -> Array:
    """A decoding step: q [R, 1, N, H] (scaled) over head-major caches k, v [B, K, S, H];
    ``bias`` [R or 1, N, 1, S] (or None) is added to the logits before the mask.

    Every decoding cache is head-major: there a single query's products with the keys and
    values are batched matrix products without transposes (in [B, S, N, H], XLA transposed
    every cache at every step; docs/performance.md). R may be a multiple G * B of the caches'
    rows: query rows g*G .. g*G + G-1 then share cache row g (beam search's G = K beams of one
    source read its encoder keys/values once, not K copies). Caches of fewer heads than the
    query: `one_query_grouped`.
    """
    if k.shape[1] != q.shape[2]:
        return one_query_grouped(q, k, v, mask, bias)
    rows, batch, num_heads, length = q.shape[0], *k.shape[:3]
    if rows % batch:
        raise ValueError(f'{rows} query rows do not share {batch} cache rows evenly.')
    group = rows // batch
    q = q.reshape(batch, group, *q.shape[2:])  # [B, G, N, H]
    logits = jnp.einsum('BGNH,BNSH->BGNS', q, k).reshape(rows, num_heads, 1, length)
    probs = masked_softmax(logits, mask, bias).reshape(batch, group, num_heads, length)
    probs = probs.astype(v.dtype)
    if group == 1:
        heads = jnp.einsum('BGNS,BNSH->BGNH', probs, v)
    else:  # as a product, ~2x slower than multiply + reduce here (CPU micro-benchmark)
        heads = jnp.sum(probs[..., None] * v[:, None], axis=3)  # [B, G, N, H]
    return heads.reshape(rows, 1, *heads.shape[2:])


def one_query_grouped(
    q: Array, k: Array, v: Array, mask: Array, bias: Array | None = None
) -> Array:
    """`one_query` for caches of K < N heads: query head i reads cache head i // G. Here R
    is the query rows per cache row."""
    rows, batch, num_kv_heads, length = q.shape[0], *k.shape[:3]
    if rows % batch:
        raise ValueError(f'{rows} query rows do not share {batch} cache rows evenly.')
    num_heads, head_dim = q.shape[2:]
    grouped = (batch, rows // batch, num_kv_heads, num_heads // num_kv_heads)
    q = q.reshape(*grouped, head_dim)  # [B, R, K, G, H]
    logits = jnp.einsum('BRKGH,BKSH->BRKGS', q, k).reshape(rows, num_heads, 1, length)
    probs = masked_softmax(logits, mask, bias).reshape(*grouped, length).astype(v.dtype)
    heads = jnp.einsum('BRKGS,BKSH->BRKGH', probs, v)
    return heads.reshape(rows, 1, num_heads, head_dim)


def cached_self_attention(
    q: Array, k: Array, v: Array, mask: Array, written: Array, bias: Array | None = None
) -> Array:
    """`one_query` over only the chunks of the self-attention cache up to the position just
    written (`cache.chunk_ends`): one branch per prefix length, each with static shapes.
    ``written``: the keys written so far (positions times the slots per position); ``bias``
    [R or 1, N, 1, S] over the whole cache, cut with it."""
    ends = cache_layout.chunk_ends(k.shape[2])

    def branch(end: int):
        def attend(q, k, v, m, b):
            b = None if b is None else b[..., :end]
            return one_query(q, k[:, :, :end], v[:, :, :end], m[..., :end], b)

        return attend

    index = jnp.searchsorted(jnp.asarray(ends), written)
    return jax.lax.switch(index, [branch(end) for end in ends], q, k, v, mask, bias)
