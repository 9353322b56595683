"""The decoder's key/value cache: its entries, their layout, and what beam search needs of it.

A decoding call of `MultiHeadAttention(..., decode=True)` keeps in flax's ``cache``
collection, per attention layer:

- self-attention: ``cached_key`` / ``cached_value`` [B, N, T', H], one position written per
  step at ``cache_index`` (`SELF_ENTRIES`, `INDEX`);
- encoder-decoder attention (``static_kv``): ``cached_static_key`` / ``cached_static_value``
  [B, N, S, H], written by the first call and only read after (`STATIC_ENTRIES`);

and, where the positions are a bias by relative position (T5's,
transformer/model/relative_positions.py), the decoder's ``key_positions`` [B, T'], the
position of each self-attention cache key (`KEY_POSITIONS`, every row alike), written by the
first call.

Beam search runs K hypotheses per source on one cache (`share_across_beams`): when
hypotheses are re-ranked nothing in the cache moves; only a [B*K, T'] slot history follows
the parents, and `beam_mask` turns it into the attention mask. This module is the one place
that knows the entries' names; beam search calls its functions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from transformer import backends

Cache = Any

SELF_ENTRIES = ('cached_key', 'cached_value')
INDEX = 'cache_index'
STATIC_ENTRIES = ('cached_static_key', 'cached_static_value')
KEY_POSITIONS = 'key_positions'

# A decoding step's self-attention reads the cache only up to the end of the chunk (of
# `backends.cache_chunks()` equal chunks) that holds the position written: the cache is sized
# for the longest output, most outputs end far earlier, and positions not yet written are
# masked anyway.


def chunk_ends(length: int) -> list[int]:
    """The key lengths a step may read in a self-attention cache of ``length`` keys: the
    ends of its chunks."""
    chunks = backends.cache_chunks()
    return sorted({-(-length * (c + 1) // chunks) for c in range(chunks)})


def padded_length(positions: int) -> int:
    """Cache positions for ``positions`` decoding steps: a multiple of the chunk count, so
    that each chunk holds whole positions (all K slots of each, in a cache shared by K
    beams)."""
    chunks = backends.cache_chunks()
    return -(-positions // chunks) * chunks


def share_across_beams(cache: Cache, beam_size: int) -> Cache:
    """The decoding cache of B sources, made into the cache of their B*K beams' rows.

    The encoder-decoder keys/values (`STATIC_ENTRIES`) stay one copy per source, which its K
    rows read. The self-attention caches [B, N, T', H] become [B, N, T' * K, H], zeros: a step
    writes the K rows' keys of position t side by side, at t * K + j for row b*K + j
    (`MultiHeadAttention._update_cache`), and each row attends to the slots its hypothesis
    went through (`beam_mask`). The keys' positions [B, T'] (`KEY_POSITIONS`) follow: key
    t * K + j is at position t.

    Raises:
      ValueError: an entry with rows that is none of the above (a cache this does not know).
    """

    def widen(path, x):
        name = getattr(path[-1], 'key', None)
        if name in SELF_ENTRIES:  # [L, ...] first in a scanned model's (model.scan_layers)
            *layers, rows, heads, length, head_dim = x.shape
            return jnp.zeros((*layers, rows, heads, length * beam_size, head_dim), x.dtype)
        if name == KEY_POSITIONS:
            return jnp.repeat(x, beam_size, axis=-1)
        if x.ndim and name not in (*STATIC_ENTRIES, INDEX):
            raise ValueError(f'Beam search does not know the cache entry {name} {x.shape}.')
        return x

    return jax.tree_util.tree_map_with_path(widen, cache)


def beam_mask(history: jax.Array, beam_size: int) -> jax.Array:
    """[B*K, 1, 1, T' * K] mask over `share_across_beams`'s keys: key t * K + j for the rows
    whose hypothesis wrote position t in slot j (``history`` [B*K, T'] int32)."""
    mask = history[:, :, None] == jnp.arange(beam_size, dtype=history.dtype)
    return mask.reshape(history.shape[0], 1, 1, -1)
