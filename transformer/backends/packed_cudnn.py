"""Packed rows handed to cuDNN's flash attention as segments (the "THD" layout), not as a mask.

`jax.nn.dot_product_attention` takes no segment ids, so packed rows reach cuDNN as a dense
[B, 1, T, S] mask turned into a bias that the kernel reads for every tile
(`model.masks.fused_arguments`). cuDNN (>= 9.6, Hopper GPUs) also takes packed rows directly:
per row, each segment's length and its start offset, [B, M] and [B, M + 1] for a static
maximum M of segments a row, through jax's private
``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`` (its ``q_seqlen``,
``kv_seqlen``, ``q_offsets``, ``kv_offsets``; jax 0.10: unused slots are -1, the offsets
are the segments' starts). It turns them into offsets into the flattened [B * T] buffer,
dropping the -1 slots of every row and lining up the query's i-th remaining segment with the
keys' i-th: the offsets are the whole correctness question (MaxText leaked attention across
segments when it passed none, AI-Hypercomputer/maxtext#4476).

So `segment_layout` puts segment id m in slot m - 1 on both sides alike, -1 on both sides
where neither has that id, and a zero-length segment (at the row's end) on the side that lacks
an id the other has: the two sides always keep the same slots.
`reference_attention` is the attention those four arrays describe, in jnp, reading nothing
else (tests/backends/test_packed_cudnn.py holds it equal to einsum attention under the
segment mask). `packed_attention` is ``model.attention_impl='cudnn_packed'``: cuDNN with the
layout on a GPU, None elsewhere (the caller then takes `jax.nn.dot_product_attention`, as the
'pallas' variant does). A batch with a segment id above M (more segments than slots) takes
the caller's path instead, chosen on the device by `jax.lax.cond` (whose predicate XLA may
read back to the host once a call: the step_variants.py row measures the whole).

Packed rows here are those of transformer/data/packing.py: each segment contiguous, ids 1, 2,
... and 0 for padding, source and target segment k from the same example.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from absl import logging

Array = jax.Array
# Segments a row may hold before a batch takes the dense-mask path; cuDNN saves softmax
# statistics of [B * M, N, T] float32 per attention call, so M is not made larger than needed.
MAX_SEGMENTS = 32


class SegmentLayout(NamedTuple):
    """Where each segment of a packed row lies, in the form cuDNN's packed attention takes.

    Slot m of row b describes segment id m + 1. Slots of ids absent from both sides are -1
    in all four arrays; an id present on one side only has length 0 on the other, its offset
    that side's row length. The last offset column is always -1 (jax's form: starts only).
    """

    q_lengths: Array  # [B, M] int32
    kv_lengths: Array  # [B, M] int32
    q_offsets: Array  # [B, M + 1] int32
    kv_offsets: Array  # [B, M + 1] int32


def _starts_and_lengths(segmentation: Array, max_segments: int) -> tuple[Array, Array]:
    """[B, M] first position and token count of ids 1..M (0 and 0 where absent)."""
    ids = jnp.arange(1, max_segments + 1, dtype=segmentation.dtype)
    member = segmentation[:, :, None] == ids  # [B, T, M]
    lengths = member.sum(axis=1, dtype=jnp.int32)
    starts = jnp.argmax(member, axis=1).astype(jnp.int32)
    return starts, lengths


def segment_layout(
    query_segmentation: Array, key_segmentation: Array, max_segments: int = MAX_SEGMENTS
) -> SegmentLayout:
    """Lengths [B, M] and offsets [B, M + 1] of the segments of packed rows (`SegmentLayout`).

    Args:
      query_segmentation: [B, T] segment ids of the queries (0 = padding).
      key_segmentation: [B, S] segment ids of the keys and values (the same as the queries'
        for self-attention, the source's for cross-attention).
      max_segments: M, static, at least 2 (cuDNN reads one segment a row as an unpacked row).
        Ids above M are in no slot: see `overflows`.
    """
    if max_segments < 2:
        raise ValueError(f'max_segments must be >= 2 (cuDNN packs 2 or more), got {max_segments}.')
    q_start, q_len = _starts_and_lengths(query_segmentation, max_segments)
    kv_start, kv_len = _starts_and_lengths(key_segmentation, max_segments)
    used = (q_len > 0) | (kv_len > 0)
    q_start = jnp.where(q_len > 0, q_start, query_segmentation.shape[1])
    kv_start = jnp.where(kv_len > 0, kv_start, key_segmentation.shape[1])
    unused = jnp.int32(-1)
    end = jnp.full((query_segmentation.shape[0], 1), -1, jnp.int32)
    return SegmentLayout(
        q_lengths=jnp.where(used, q_len, unused),
        kv_lengths=jnp.where(used, kv_len, unused),
        q_offsets=jnp.concatenate([jnp.where(used, q_start, unused), end], axis=1),
        kv_offsets=jnp.concatenate([jnp.where(used, kv_start, unused), end], axis=1),
    )


def overflows(segmentations: tuple[Array, ...], max_segments: int = MAX_SEGMENTS) -> Array:
    """Whether any row holds a segment id above ``max_segments`` (a scalar bool): its tokens
    would be in no slot of `segment_layout`."""
    return jnp.any(jnp.stack([s.max() for s in segmentations]) > max_segments)


def _slots(lengths: Array, offsets: Array, length: int) -> Array:
    """[B, L] the slot each position lies in by the layout, -1 for none."""
    position = jnp.arange(length, dtype=jnp.int32)[None, :, None]
    start = offsets[:, None, :-1]
    inside = (position >= start) & (position < start + lengths[:, None, :]) & (start >= 0)
    return jnp.where(inside.any(-1), jnp.argmax(inside, axis=-1), -1)


def reference_attention(q: Array, k: Array, v: Array, layout: SegmentLayout, causal: bool) -> Array:
    """softmax(q k^T / sqrt(H)) v where query and key lie in the same slot of ``layout`` (and,
    if ``causal``, the key is no later in its segment than the query in its own), in float32;
    queries with no key get zeros. q [B, T, N, H], k and v [B, S, N, H]; only ``layout`` says
    who attends to whom."""
    t, s = q.shape[1], k.shape[1]
    q_slot = _slots(layout.q_lengths, layout.q_offsets, t)  # [B, T]
    kv_slot = _slots(layout.kv_lengths, layout.kv_offsets, s)  # [B, S]
    mask = (q_slot[:, :, None] == kv_slot[:, None, :]) & (q_slot[:, :, None] >= 0)
    if causal:
        q_start = jnp.take_along_axis(layout.q_offsets, jnp.maximum(q_slot, 0), axis=1)
        kv_start = jnp.take_along_axis(layout.kv_offsets, jnp.maximum(kv_slot, 0), axis=1)
        within_q = jnp.arange(t) - q_start  # [B, T]
        within_kv = jnp.arange(s) - kv_start  # [B, S]
        mask &= within_kv[:, None, :] <= within_q[:, :, None]
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    logits = jnp.einsum('BTNH,BSNH->BNTS', q, k) * q.shape[-1] ** -0.5
    logits = jnp.where(mask[:, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1) * mask[:, None]
    return jnp.einsum('BNTS,BSNH->BTNH', probs, v)


def attends(layout: SegmentLayout, num_queries: int) -> Array:
    """[B, T, 1, 1]: the query lies in a segment that has at least one key (its output is
    cuDNN's; elsewhere it must be zeros, as in the einsum path)."""
    q_slot = _slots(layout.q_lengths, layout.q_offsets, num_queries)
    has_keys = jnp.take_along_axis(layout.kv_lengths, jnp.maximum(q_slot, 0), axis=1) > 0
    return ((q_slot >= 0) & has_keys)[:, :, None, None]


def _cudnn(q: Array, k: Array, v: Array, layout: SegmentLayout, causal: bool) -> Array:
    """cuDNN's packed flash attention (raises off a Hopper GPU with cuDNN)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    out = cudnn.dot_product_attention(
        q,
        k,
        v,
        q_seqlen=layout.q_lengths,
        kv_seqlen=layout.kv_lengths,
        q_offsets=layout.q_offsets,
        kv_offsets=layout.kv_offsets,
        scale=float(q.shape[-1]) ** -0.5,
        mask_type=cudnn.MaskType.CAUSAL if causal else cudnn.MaskType.NO_MASK,
        qkv_layout='BTNH',
    )
    return jnp.where(attends(layout, q.shape[1]), out, 0).astype(out.dtype)


def packed_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Any,
    fallback: Callable[[Array, Array, Array, Any], Array],
    max_segments: int = MAX_SEGMENTS,
) -> Array | None:
    """Attention of packed rows by cuDNN's packed layout, [B, T, N, H]; None where it does not
    apply: a mask without segmentations, inputs not 16-bit, no GPU, or a cuDNN that refuses
    (not Hopper, too old; logged as a warning); the caller then takes ``fallback`` itself.

    Args:
      q: queries [B, T, N, H] (not yet scaled).
      k: keys [B, S, N, H].
      v: values [B, S, N, H].
      mask: a `model.masks.AttentionMask` of packed rows (self- or cross-attention).
      fallback: ``fallback(q, k, v, mask)``, the dense-mask attention, taken for a batch with
        more than ``max_segments`` segments in a row.
      max_segments: M of `segment_layout`.
    """
    segments = getattr(mask, 'query_segmentation', None)
    if segments is None or mask.key_segmentation is None:
        return None
    if jax.default_backend() != 'gpu' or q.dtype not in (jnp.bfloat16, jnp.float16):
        return None
    layout = segment_layout(segments, mask.key_segmentation, max_segments)
    too_many = overflows((segments, mask.key_segmentation), max_segments)
    try:
        return jax.lax.cond(
            too_many,
            lambda q, k, v: fallback(q, k, v, mask).astype(q.dtype),
            lambda q, k, v: _cudnn(q, k, v, layout, mask.causal),
            q,
            k,
            v,
        )
    except (ValueError, NotImplementedError, RuntimeError, TypeError, ImportError) as e:
        # A cuDNN, GPU or shape the packed kernel does not take, or a jax whose private
        # wrapper moved: said once a trace, then the caller's path.
        logging.warning('cudnn_packed attention falls back to the dense mask: %r', e)
        return None
