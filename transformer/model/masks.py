"""Who may attend to whom: a batch's attention mask kept as its parts, made dense for the einsum
path and handed to cuDNN as sequence lengths where the rows allow it.

Shape legend (transformer/model/attention.py): B batch · T query positions · S key positions
· N heads.

The dense [B, 1, T, S] boolean mask says everything but costs the fused kernel: cuDNN reads it
as a [B, 1, T, S] bias and must visit every tile of the T x S matrix. Sequence lengths (a row's
real positions are its first ones) and a causal flag let cuDNN skip the padded and the future
tiles instead. `jax.nn.dot_product_attention` (jax 0.10-0.11) takes lengths and ``is_causal``
but nothing that describes packed rows (several examples in one row): for those the dense mask
stays (`fused_arguments` is the one place that decides).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


@struct.dataclass
class AttentionMask:
    """Query t of row b may attend key s when both are real (not padding) positions, they lie in
    the same packed segment (when segmentations are given) and, if ``causal``, s <= t.

    Attributes:
      query_valid: [B, T] bool, the real queries; in unpacked rows they are the first ones.
      key_valid: [B, S] bool, the real keys; likewise.
      query_segmentation: [B, T] packed example ids (0 = padding), or None: one example a row.
      key_segmentation: [B, S], or None.
      causal: keys after the query are hidden (decoder self-attention, Sec. 3.2.3).
    """

    query_valid: Array
    key_valid: Array
    query_segmentation: Array | None = None
    key_segmentation: Array | None = None
    causal: bool = struct.field(pytree_node=False, default=False)

    @property
    def packed(self) -> bool:
        return self.query_segmentation is not None

    def dense(self) -> Array:
        """The boolean [B, 1, T, S] mask (True = may attend)."""
        mask = self.query_valid[:, None, :, None] & self.key_valid[:, None, None, :]
        if self.packed:
            same = self.query_segmentation[:, :, None] == self.key_segmentation[:, None, :]
            mask = mask & same[:, None]
        if self.causal:
            t, s = self.query_valid.shape[1], self.key_valid.shape[1]
            mask = mask & jnp.tril(jnp.ones((t, s), bool))[None, None]
        return mask


def dense(mask: AttentionMask | Array | None) -> Array | None:
    """A boolean array (or None) for any mask: `AttentionMask.dense` of a structured one."""
    return mask.dense() if isinstance(mask, AttentionMask) else mask


def fused_arguments(
    mask: AttentionMask | Array | None, batch: int, num_queries: int, num_keys: int
) -> tuple[dict[str, Any], Array | None]:
    """What `jax.nn.dot_product_attention` is given for ``mask``, and which queries attend.

    Unpacked rows (an `AttentionMask` without segmentations) go as ``query_seq_lengths``,
    ``key_value_seq_lengths`` and ``is_causal``: cuDNN then skips padded and future tiles and
    reads no [B, 1, T, S] bias. The lengths count the real positions, which are a row's first
    ones in every unpacked batch here (evaluation batches, decoding, the API). Packed rows and
    plain arrays go as the dense boolean ``mask``: the public API has no segment ids (jax's
    private cuDNN wrapper takes packed offsets on Hopper GPUs; handed them, an H200 computed
    wrong gradients: docs/experiments.md, "Removed options").

    Args:
      mask: the mask, or None (everything attends).
      batch: B.
      num_queries: T.
      num_keys: S.

    Returns:
      (keyword arguments, ``attends``): ``attends`` broadcasts against the [B, T, N, H] output
      and is False for queries that may attend to no key, whose output must be zeros (as in
      the einsum path); None when every query attends.
    """
    if mask is None:
        return {}, None
    if isinstance(mask, AttentionMask) and not mask.packed:
        q_len = mask.query_valid.sum(axis=-1, dtype=jnp.int32)
        kv_len = mask.key_valid.sum(axis=-1, dtype=jnp.int32)
        attends = (jnp.arange(num_queries) < q_len[:, None]) & (kv_len[:, None] > 0)
        # An empty row still gets one position, so that no kernel sees a zero length; its
        # outputs are zeroed through ``attends``.
        arguments = {
            'query_seq_lengths': jnp.maximum(q_len, 1),
            'key_value_seq_lengths': jnp.maximum(kv_len, 1),
            'is_causal': mask.causal,
        }
        return arguments, attends[:, :, None, None]
    mask = dense(mask)
    mask = jnp.broadcast_to(mask, (batch, mask.shape[1], num_queries, num_keys))
    attends = jnp.swapaxes(jnp.any(mask, axis=-1), 1, 2)[..., None]  # [B, T, N or 1, 1]
    return {'mask': mask}, attends


def masked_softmax(
    logits: Array, mask: AttentionMask | Array | None, bias: Array | None = None
) -> Array:
    """Softmax over the last axis of ``logits + bias`` where ``mask`` is True; rows with no
    True give all zeros. ``bias`` (broadcastable to the logits, or None) is added in float32
    before the mask, so a masked position stays masked whatever its bias.

    Masked logits are replaced by the most negative finite float32 (never -inf, so no
    inf - inf), the softmax runs in float32, and the result is multiplied by the mask so a
    query that may attend to nothing (a padding query, an empty packed segment) yields exactly
    zero weights instead of a uniform average or NaN.
    """
    logits, mask = logits.astype(jnp.float32), dense(mask)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits, axis=-1) * mask


@struct.dataclass
class AttentionInputs:
    """What one attention call reads beside the vectors it attends from and to, as one value.

    Attributes:
      mask: an `AttentionMask`, or boolean broadcastable to [B, N, T, S] (True = may attend),
        or None (all).
      positions: [B, T], the positions of self-attention's tokens (each packed example's
        own, the step's when decoding), which a rotary position encoding turns the queries
        and keys by (transformer/model/positions.py); None: no rotation (cross-attention).
      bias: added to the attention logits before the mask, [B or 1, N, T, S] (a decoding
        step's: [B or 1, N, 1, S] over the whole cache); None: nothing.
    """

    mask: AttentionMask | Array | None = None
    positions: Array | None = None
    bias: Array | None = None

    @classmethod
    def of(cls, value: AttentionInputs | AttentionMask | Array | None) -> AttentionInputs:
        """``value`` itself, or a bare mask as the inputs of an attention without positions."""
        return value if isinstance(value, AttentionInputs) else cls(mask=value)
