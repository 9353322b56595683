"""Scaled dot-product attention, softmax(scale * q k^T + bias) v (Sec. 3.2.1), the one function
every path of `MultiHeadAttention` computes it with: `attend`.

Shape legend (transformer/model/attention.py): B batch · T query positions · S key positions
· N heads · K key/value heads · H head dim.

The paths compute the same thing in different ways: the einsums with the explicit [B, N, T, S]
probabilities (sown, dropped out), `jax.nn.dot_product_attention` (cuDNN's fused kernel on a
GPU, XLA's elsewhere), Pallas's kernel by segment ids for packed self-attention
(transformer/backends/segment_attention.py), and a decoding step's single query over the
head-major caches (transformer/model/decode_attention.py). What they share is written here
once: the scale on the logits (``model.attention_scale``: None is the paper's 1/sqrt(H); T5
uses 1.0), the additive logits bias [B or 1, N, T, S] (None: none; added before the mask) and
the mask.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from transformer import backends
from transformer.model import decode_attention, masks
from transformer.model.masks import AttentionMask, masked_softmax

Array = jax.Array


def logits_scale(head_dim: int, scale: float | None) -> float:
    """The factor on q k^T: ``scale``, or None: 1/sqrt(H) (Sec. 3.2.1; jax's default too),
    written as ``H ** -0.5``, the float the segment-id kernel's ``sm_scale`` always had."""
    return float(head_dim) ** -0.5 if scale is None else float(scale)


def scale_queries(q: Array, scale: float | None, dtype: Any) -> Array:
    """q times the logits' factor, in ``dtype``: fewer multiplies than scaling the [B, N, T, S]
    logits, the same result. The default divides by sqrt(H), as the einsum path always has."""
    if scale is None:
        return q / jnp.sqrt(q.shape[-1]).astype(dtype)
    return q if scale == 1.0 else q * jnp.asarray(scale, dtype)


def attention_logits(q: Array, k: Array) -> Array:
    """q [B, T, N, H] . k [B, S, K, H] -> logits [B, N, T, S]; query head i reads key head
    i // (N / K)."""
    num_heads, num_kv_heads = q.shape[2], k.shape[2]
    if num_kv_heads == num_heads:
        return backends.einsum('BTNH,BSNH->BNTS', q, k)
    q = q.reshape(*q.shape[:2], num_kv_heads, num_heads // num_kv_heads, q.shape[3])
    logits = backends.einsum('BTKGH,BSKH->BKGTS', q, k)
    return logits.reshape(logits.shape[0], num_heads, *logits.shape[3:])


def attention_values(probs: Array, v: Array) -> Array:
    """probs [B, N, T, S] . v [B, S, K, H] -> heads [B, T, N, H]; query head i reads value
    head i // (N / K)."""
    num_heads, num_kv_heads = probs.shape[1], v.shape[2]
    if num_kv_heads == num_heads:
        return backends.einsum('BNTS,BSNH->BTNH', probs, v)
    group = num_heads // num_kv_heads
    probs = probs.reshape(probs.shape[0], num_kv_heads, group, *probs.shape[2:])
    heads = backends.einsum('BKGTS,BSKH->BTKGH', probs, v)
    return heads.reshape(*heads.shape[:2], num_heads, heads.shape[-1])


def fused_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: AttentionMask | Array | None,
    bias: Array | None = None,
    scale: float | None = None,
) -> Array:
    """softmax(scale * q k^T + bias) v over [B, T, N, H] inputs by `jax.nn.dot_product_attention`.

    On an NVIDIA GPU with 16-bit inputs this is cuDNN's fused (flash) attention, which never
    writes the [B, N, T, S] matrix; elsewhere, or where cuDNN rejects the shapes or the bias
    (logged in one line), it is XLA's reference implementation. Unpacked rows reach it as
    sequence lengths and a causal flag, packed rows as the dense mask
    (`masks.fused_arguments`). Queries with no valid key get zeros, as in `masked_softmax`
    (both implementations would otherwise average or return garbage there). q [B, T, N, H]
    (not yet scaled), k and v [B, S, K, H] (K divides N: grouped heads, which both
    implementations take); ``mask`` an `AttentionMask`, or boolean broadcastable to
    [B, N, T, S] (True = may attend); ``bias`` [B or 1, N, T, S]; ``scale`` None: 1/sqrt(H).
    """
    arguments, attends = masks.fused_arguments(mask, q.shape[0], q.shape[1], k.shape[1])
    if bias is not None:  # cuDNN takes a bias of the inputs' dtype only
        arguments['bias'] = bias.astype(q.dtype)
    if scale is not None:  # None: jax's own default, the same 1/sqrt(H)
        arguments['scale'] = logits_scale(q.shape[-1], scale)
    out = None
    if jax.default_backend() == 'gpu' and q.dtype in (jnp.bfloat16, jnp.float16):
        try:
            out = jax.nn.dot_product_attention(q, k, v, **arguments, implementation='cudnn')
        except (ValueError, NotImplementedError, RuntimeError) as error:
            out = None  # a shape or mask cuDNN does not support: XLA below
            if bias is not None:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                logging.warning('cuDNN refused the logits bias (%s); XLA computes it.', reason)
    if out is None:
        out = jax.nn.dot_product_attention(q, k, v, **arguments, implementation='xla')
    if attends is None:
        return out
    return jnp.where(attends, out, 0).astype(out.dtype)


def pallas_refusal(bias: Array | None) -> str | None:
    """Why packed self-attention cannot take Pallas's segment-id kernel, or None where it can."""
    if bias is None:
        return None
    return (
        "model.attention_impl='pallas': the segment-id kernel takes no logits bias; "
        "packed self-attention runs as 'fused' instead."
    )


def attend(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: AttentionMask | Array | None = None,
    bias: Array | None = None,
    scale: float | None = None,
    impl: str = 'einsum',
    dtype: Any = None,
    packed_self_attention: bool = False,
    cached: bool = False,
    written: Array | None = None,
    on_probs: Callable[[Array], Array] | None = None,
) -> Array:
    """The heads [B, T, N, H] of softmax(scale * q k^T + bias) v where ``mask`` allows.

    Args:
      q: queries [B, T, N, H], not yet scaled.
      k: keys [B, S, K, H], or with ``cached`` the head-major caches [B', K, S, H].
      v: values, as ``k``.
      mask: an `AttentionMask`, or boolean broadcastable to [B, N, T, S]; True = may attend.
      bias: added to the logits before the mask, [B or 1, N, T, S]; None: nothing.
      scale: the factor on q k^T; None: 1/sqrt(H) (``model.attention_scale``).
      impl: 'einsum' (explicit probabilities), 'fused' (`fused_attention`) or 'pallas'
        ('fused', packed self-attention by Pallas's segment-id kernel where it applies).
      dtype: the computation dtype (the queries' scale, the probabilities before the values);
        None: the values'.
      packed_self_attention: the call is self-attention over the rows as given (not a decoding
        step), which the 'pallas' kernel may take.
      cached: a decoding step, one query per row over the caches
        (transformer/model/decode_attention.py); ``impl`` is not read.
      written: with ``cached``, the self-attention keys written so far; None: the encoder's
        keys, all of them.
      on_probs: the einsum path's [B, N, T, S] probabilities go through it (sown, dropped out).
    """
    dtype = dtype or v.dtype
    if cached:
        q = scale_queries(q, scale, dtype)
        if written is None:
            return decode_attention.one_query(q, k, v, mask, bias)
        return decode_attention.cached_self_attention(q, k, v, mask, written, bias)
    if impl != 'einsum':
        out = None
        if impl == 'pallas' and packed_self_attention:
            refusal = pallas_refusal(bias)
            if refusal:
                logging.warning(refusal)
            else:
                factor = logits_scale(q.shape[-1], scale)
                out = backends.packed_self_attention(q, k, v, mask, scale=factor)
        return fused_attention(q, k, v, mask, bias, scale) if out is None else out
    probs = masked_softmax(attention_logits(scale_queries(q, scale, dtype), k), mask, bias)
    if on_probs is not None:
        probs = on_probs(probs)
    return attention_values(probs.astype(dtype), v)
