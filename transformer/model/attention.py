"""Multi-head attention written as einsums over an explicit head axis (Sec. 3.2).

Shape legend, used in every einsum of this package:

    B batch · T target (query) positions · S source (key/value) positions · D d_model
    N heads · H head dim (d_k = d_v) · F d_ff · V vocabulary
    K key/value heads · G query heads per key/value head (N = K * G)

What stays different between heads is the attention itself: each head forms its own T x S
matrix softmax(Q_i K_i^T / sqrt(d_k)), which is why the einsums below keep N as an axis of
their own instead of folding it into D. Those [B, N, T, S] probabilities are sown into the
``intermediates`` collection as ``attention_weights`` so that every head can be inspected.
The projections' parameters, one [D, N, H] array that is both head i's W_i and the fused
matrix, are model/projections.py's.

Keys and values may have fewer heads than queries, K dividing N (multi-query attention, K = 1:
Shazeer, 2019, "Fast Transformer Decoding"; grouped-query attention: Ainslie et al., 2023,
"GQA"): query head i reads key/value head i // G, G = N / K, as `jax.nn.dot_product_attention`
groups them. The key and value kernels are then [D, K, H] and the decoding caches hold K
heads; the attention weights stay one [T, S] matrix per query head. K = N is the paper's
multi-head attention, computed by the same einsums as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import einops
import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformer import backends
from transformer.model import cache as cache_layout
from transformer.model import masks
from transformer.model.constraints import HEADS, constrain
from transformer.model.dot_product import attend
from transformer.model.dropout import Dropout
from transformer.model.masks import AttentionInputs, AttentionMask
from transformer.model.projections import (
    OUT_AXES,
    QKV_AXES,
    Projection,
    fused_projections,
    out_kernel_init,
    qkv_kernel_init,
)
from transformer.model.remat import ATTENTION_OUTPUT

Array = jax.Array
Dtype = Any


# 'auto': the measured winner (`backends.attention_impl`); the others: see MultiHeadAttention.
ATTENTION_IMPLS = ('auto', 'einsum', 'fused', 'pallas')


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, Sec. 3.2.2.

    Parameters: ``query/kernel`` [D, N, H], ``key/kernel``, ``value/kernel`` [D, K, H] and
    ``out/kernel`` [N, H, D] (plus ``bias`` entries when ``use_bias``; ``query_norm/scale``,
    ``key_norm/scale`` [H] with ``qk_norm``). See the module docstring for why each kernel is
    at once the per-head matrices and the fused matrix.

    Attributes:
      num_heads: N.
      head_dim: H (d_k = d_v); defaults to D // N.
      dropout_rate: dropout on the attention probabilities.
      dtype: computation dtype (softmax always runs in float32).
      param_dtype: parameter dtype.
      use_bias: add biases to the four projections (the paper's equations have none).
      attention_impl: 'einsum' (explicit logits and masked softmax; sows the weights),
        'fused' (`fused_attention`: cuDNN flash attention on NVIDIA GPUs, XLA elsewhere; no
        weights are sown, and attention dropout falls back to 'einsum'), 'pallas' ('fused',
        packed self-attention by segment ids on a GPU: backends/segment_attention.py), or
        'auto' (the measured winner on this backend: `backends.attention_impl`).
      num_kv_heads: K, the key and value heads, a divisor of N; None: N (the paper's).
      qk_norm: an RMSNorm (epsilon ``norm_epsilon``) over each head's H channels of the
        queries and the keys before their product (QK-norm); the encoder-decoder keys are
        cached normed.
      norm_epsilon: QK-norm's epsilon.
      position_encoding: what turns self-attention's queries and keys by their positions
        (``rotate``: transformer/model/positions.py), or None: nothing does.
      scale: the factor on q k^T (``model.attention_scale``); None: 1/sqrt(H) (Sec. 3.2.1).
    """

    num_heads: int
    head_dim: int | None = None
    dropout_rate: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    use_bias: bool = False
    attention_impl: str = 'einsum'
    num_kv_heads: int | None = None  # from here on: positional callers of the above keep theirs
    qk_norm: bool = False
    norm_epsilon: float = 1e-6
    position_encoding: Any = None
    scale: float | None = None

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        inputs: AttentionInputs | AttentionMask | Array | None = None,
        *,
        deterministic: bool = True,
        decode: bool = False,
        static_kv: bool = False,
    ) -> Array:
        """Attends from ``inputs_q`` [B, T, D] to ``inputs_kv`` [B, S, D], or to itself.

        Args:
          inputs_q: queries, [B, T, D].
          inputs_kv: keys and values, [B, S, D]; None: self-attention, keys and values from
            ``inputs_q`` (S = T), the three projections applied as one einsum
            (`fused_projections`).
          inputs: an `AttentionInputs` (the mask, the logits bias and self-attention's
            positions), or the mask alone: an `AttentionMask`, or boolean broadcastable to
            [B, N, T, S]; True = may attend.
          deterministic: disables dropout.
          decode: self-attention one position per call with a key/value cache in the
            ``cache`` collection. The first call (at ``init``) sizes the cache from the
            full-length inputs; later calls take T = 1 and attend to every cached
            position up to and including the current one (beam search's shared rows: see
            `_update_cache`).
          static_kv: with ``decode``, ``inputs_kv`` is the same at every call (the encoder
            output that encoder-decoder attention reads). The call that creates the cache
            projects it into ``cached_static_key`` / ``cached_static_value`` [B, K, S, H];
            later calls attend to those and never read ``inputs_kv``, so the S x D x N x H
            projections run once per decoding instead of once per position.

        Returns:
          [B, T, D].
        """
        if inputs_kv is None and static_kv:
            raise ValueError('static_kv caches the keys of inputs_kv; self-attention has none.')
        inputs = AttentionInputs.of(inputs)
        head_dim = self.head_dim or inputs_q.shape[-1] // self.num_heads
        query, key, value, out = self._projections(inputs_q.shape[-1], head_dim)
        normalize_q, normalize_k = self._qk_norms()
        # Projections, QK-norm, then the positions' rotation (self-attention only).
        if inputs_kv is None:
            q, k, v = fused_projections(inputs_q, (query, key, value))
            q, k = normalize_q(q), normalize_k(k)
            if self.position_encoding is not None:
                q, k = self.position_encoding.rotate(q, k, inputs.positions)
        else:
            q = normalize_q(query(inputs_q))
            k, v = self._keys_values(key, value, normalize_k, inputs_kv, decode and static_kv)
        if not decode:
            q, k, v = (constrain(x, HEADS) for x in (q, k, v))
        elif not static_kv:
            k, v, mask = self._update_cache(k, v, inputs.mask)
            inputs = inputs.replace(mask=mask)
        heads = self._attend(q, k, v, inputs, deterministic, decode, static_kv, inputs_kv is None)
        return out(checkpoint_name(heads, ATTENTION_OUTPUT))  # what model.remat='attention' keeps

    def _attend(self, q, k, v, inputs, deterministic, decode, static_kv, self_attention) -> Array:
        """The heads [B, T, N, H] of `dot_product.attend`: a decoding step's single query over
        the cache (transformer/model/decode_attention.py), the backend's fused attention
        ('fused', 'pallas'), or the einsums with their sown weights and attention dropout."""
        dropout = not deterministic and self.dropout_rate > 0.0
        one_query = decode and q.shape[1] == 1 and not dropout
        if decode and not one_query:  # the call that made the cache: back to [B, S, N, H]
            k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        impl = backends.attention_impl(self.attention_impl)
        written = None
        if one_query and not static_kv:
            # Keys written so far: positions times the slots per position (`_update_cache`).
            positions = self.get_variable('cache', cache_layout.INDEX)
            written = positions * (q.shape[0] // k.shape[0])

        def on_probs(probs: Array) -> Array:
            self.sow('intermediates', 'attention_weights', probs)
            if dropout:
                probs = Dropout(rate=self.dropout_rate)(probs, deterministic=False)
            return probs

        return attend(
            q,
            k,
            v,
            mask=inputs.mask,
            bias=inputs.bias,
            scale=self.scale,
            impl='einsum' if dropout else impl,
            dtype=self.dtype,
            packed_self_attention=self_attention and not decode,
            cached=one_query,
            written=written,
            on_probs=on_probs,
        )

    def _qk_norms(self) -> tuple[Callable[[Array], Array], Callable[[Array], Array]]:
        """QK-norm's RMSNorms of the queries and the keys over H, or two identities."""
        if not self.qk_norm:
            return (lambda x: x), (lambda x: x)
        norm = lambda name: nn.RMSNorm(  # noqa: E731
            epsilon=self.norm_epsilon,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ('kv',)),
            name=name,
        )
        return norm('query_norm'), norm('key_norm')

    def _projections(self, d_model: int, head_dim: int) -> tuple[Projection, ...]:
        """The query [D, N, H], key, value [D, K, H] and out [N, H, D] projections."""
        num_kv_heads = self.num_kv_heads or self.num_heads
        if num_kv_heads < 1 or self.num_heads % num_kv_heads:
            raise ValueError(f'num_kv_heads={num_kv_heads} must divide num_heads={self.num_heads}.')

        def project(name: str, equation: str, kernel_shape, bias_shape, init, axes):
            return Projection(
                equation=equation,
                kernel_shape=kernel_shape,
                bias_shape=bias_shape,
                kernel_init=init,
                kernel_axes=axes,
                use_bias=self.use_bias,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                name=name,
            )

        heads_shape, kv_shape = (self.num_heads, head_dim), (num_kv_heads, head_dim)
        q = ((d_model, *heads_shape), heads_shape, qkv_kernel_init, QKV_AXES)
        kv = ((d_model, *kv_shape), kv_shape, qkv_kernel_init, QKV_AXES)
        out_shape = (*heads_shape, d_model)
        return (
            project('query', 'BTD,DNH->BTNH', *q),
            project('key', 'BSD,DKH->BSKH', *kv),
            project('value', 'BSD,DKH->BSKH', *kv),
            project('out', 'BTNH,NHD->BTD', out_shape, (d_model,), out_kernel_init, OUT_AXES),
        )

    def _update_cache(self, k: Array, v: Array, mask: Array | None):
        """Writes this step's key/value into the head-major cache and masks the keys not yet
        written. Returns the caches (head-major) and the mask.

        The cache is [B, N, T', H] (N: the key/value heads, fewer than the queries' with
        grouped heads), or, when it has fewer rows than the step (beam search,
        transformer/model/cache.py), [B, N, T' * K, H] for K = rows / B: key t * K + j holds
        position t of row b * K + j, and the rows b*K .. b*K + K-1 share cache row b. A row
        then sees the other rows' keys too; the ``mask`` it is given says which are its own
        history.
        """
        k, v, mask = k.swapaxes(1, 2), v.swapaxes(1, 2), masks.dense(mask)  # [B, N, T, H]
        key_name, value_name = cache_layout.SELF_ENTRIES
        is_initialized = self.has_variable('cache', key_name)
        cached_key = self.variable('cache', key_name, jnp.zeros, k.shape, k.dtype)
        cached_value = self.variable('cache', value_name, jnp.zeros, v.shape, v.dtype)
        zero = lambda: jnp.array(0, jnp.int32)  # noqa: E731
        cache_index = self.variable('cache', cache_layout.INDEX, zero)
        if not is_initialized:
            # The init call only sizes the cache; it attends over its full input as usual.
            return k, v, mask
        cache_rows, _, length, _ = cached_key.value.shape
        if k.shape[2] != 1:
            raise ValueError(f'decode=True takes one position per call, got {k.shape[2]}.')
        if k.shape[0] % cache_rows:
            raise ValueError(f'{k.shape[0]} rows do not share {cache_rows} cache rows evenly.')
        slots = k.shape[0] // cache_rows
        if slots > 1:  # [B*K, N, 1, H] -> [B, N, K, H]: one key per slot
            k, v = (einops.rearrange(x, '(B K) N 1 H -> B N K H', K=slots) for x in (k, v))
        index = cache_index.value
        start = (0, 0, index * slots, 0)
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k, start)
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v, start)
        cache_index.value = index + 1
        written = (jnp.arange(length) // slots <= index)[None, None, None, :]  # [1, 1, 1, S]
        mask = written if mask is None else jnp.logical_and(mask, written)
        return cached_key.value, cached_value.value, mask

    def _keys_values(
        self,
        key: Projection,
        value: Projection,
        normalize_k: Callable[[Array], Array],
        inputs_kv: Array,
        static_cache: bool,
    ) -> tuple[Array, Array]:
        """Keys (after QK-norm) and values of ``inputs_kv``: [B, S, K, H], or with
        ``static_cache`` head-major [B, K, S, H] in the cache.

        There they are projected and stored by the call that finds them missing, and read back
        by every later one (see `decode_attention.one_query` for the layout).
        """
        key_name, value_name = cache_layout.STATIC_ENTRIES
        if static_cache and self.has_variable('cache', key_name):
            return self.get_variable('cache', key_name), self.get_variable('cache', value_name)
        k, v = fused_projections(inputs_kv, (key, value))
        k = normalize_k(k)
        if not static_cache:
            return k, v
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        self.put_variable('cache', key_name, k)
        self.put_variable('cache', value_name, v)
        return k, v
