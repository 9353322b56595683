"""Self-attention of packed rows by Pallas's GPU flash attention, which takes segment ids
(`jax.experimental.pallas.ops.gpu.attention.mha`, a Triton kernel): no [B, 1, T, S] mask is
made or read, where cuDNN through `jax.nn.dot_product_attention` is handed the dense mask for
packed rows (`model.masks.fused_arguments`). ``model.attention_impl='pallas'`` takes it for
the encoder's and the decoder's self-attention of packed rows and cuDNN for the rest; whether
it is faster is for `benchmarks/step_variants.py` to say on the GPU.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
# Runs the kernel in Pallas's interpreter on any backend (the tests, on a CPU).
INTERPRET = False
FORWARD_BLOCK, BACKWARD_BLOCK = 128, 32  # the kernel's default tiles along the sequence


def packed_self_attention(q: Array, k: Array, v: Array, mask: Any, *, scale: float) -> Array | None:
    """softmax(scale * q k^T) v within each packed segment (and causal where the mask is),
    [B, T, N, H]; padding's outputs are zeros, as in the einsum path. None where the kernel
    does not apply: a mask that is not an `AttentionMask` of packed rows, a length the tiles
    do not divide, or neither a GPU nor `INTERPRET`; the caller then takes another path.

    Args:
      q: queries [B, T, N, H] (not yet scaled).
      k: keys [B, T, N, H] of the same rows (self-attention: the query segmentation is the
        keys').
      v: values [B, T, N, H]. Keys and values of K < N heads (grouped heads) are repeated
        to N for the kernel, head j serving query heads j * N / K .. (j + 1) * N / K - 1.
      mask: the self-attention's `model.masks.AttentionMask`.
      scale: the factor on the logits (transformer/model/dot_product.py `logits_scale`).
    """
    segments = getattr(mask, 'query_segmentation', None)
    if segments is None or q.shape[1] != k.shape[1]:
        return None
    if not (INTERPRET or jax.default_backend() == 'gpu'):
        return None
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    length = q.shape[1]
    if k.shape[2] != q.shape[2]:  # grouped heads (K < N): the kernel takes N of each
        k, v = (jnp.repeat(x, q.shape[2] // k.shape[2], axis=2) for x in (k, v))
    forward, backward = min(FORWARD_BLOCK, length), min(BACKWARD_BLOCK, length)
    if length % forward or length % backward:
        return None
    blocks = pallas_attention.BlockSizes(
        block_q=forward,
        block_k=forward,
        block_q_dkv=backward,
        block_kv_dkv=backward,
        block_q_dq=backward,
        block_kv_dq=backward,
    )
    out = pallas_attention.mha(
        q,
        k,
        v,
        segments.astype(jnp.int32),
        sm_scale=scale,
        causal=mask.causal,
        block_sizes=blocks,
        interpret=INTERPRET,
    )
    return jnp.where(mask.query_valid[:, :, None, None], out, 0).astype(out.dtype)
