"""The Transformer's layers: the encoder and decoder layers and their residual sub-layers,
the decoder's inputs shifted right, the decoding step's position, and `attention_mask`, which
makes the layers' masks (kept as parts by transformer/model/masks.py). Each layer's
feed-forward and norms are the modules of the `variants.Variant`s that ``model.ffn`` and
``model.norm`` choose (transformer/model/feed_forward.py, norms.py); the positions are
transformer/model/positions.py's.

Shape legend (see transformer/model/attention.py): B batch · T target positions · S source
positions · D d_model · F d_ff. Every parameter declares its logical axis names where it is
created ('embed' = D, 'mlp' = F, ...); transformer/training/parallel.py maps them onto mesh axes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.model import variants
from transformer.model.attention import MultiHeadAttention
from transformer.model.config import TransformerConfig
from transformer.model.constraints import BETWEEN_LAYERS, constrain
from transformer.model.dropout import Dropout
from transformer.model.masks import AttentionInputs, AttentionMask

Array = jax.Array


def partitioned(init, axes: tuple[str, ...]):
    return nn.with_logical_partitioning(init, axes)


def norm(cfg: TransformerConfig, name: str) -> nn.Module:
    """The normalization ``model.norm`` chooses (transformer/model/norms.py): [..., D] ->
    [..., D]."""
    return variants.chosen(cfg, 'norm').module(cfg, name=name)


def shift_right(targets: Array, segmentation: Array | None = None, *, start: int) -> Array:
    """Decoder inputs: targets shifted one place right, starting with the vocabulary's start
    token ``start`` (`SpecialIds.decoder_start`: 0, the padding id, for the joint vocabulary).

    With packing, every example in the row starts with its own start token: the first
    token of each segment is ``start`` instead of the previous example's last token.
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=start)[:, :-1]
    if segmentation is not None:
        prev_segment = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
        shifted = jnp.where(segmentation == prev_segment, shifted, start)
    return shifted


def attention_mask(
    query_valid: Array,
    key_valid: Array,
    query_segmentation: Array | None = None,
    key_segmentation: Array | None = None,
    causal: bool = False,
) -> AttentionMask:
    """Both positions real, same packed segment, and (if causal) key position <= query
    position, kept as these parts: `AttentionMask.dense` is the boolean [B, 1, T, S] mask, and
    the fused attention path hands cuDNN sequence lengths instead where rows are unpacked."""
    return AttentionMask(query_valid, key_valid, query_segmentation, key_segmentation, causal)


@dataclasses.dataclass(frozen=True)
class LayerFlags:
    """The layers' Python flags, one hashable value: every layer takes it as its first
    argument, which `remat.rematerialized` (and a scan over layers) hold static.

    Attributes:
      deterministic: no dropout.
      decode: one decoding step with the key/value cache (the decoder's self-attention).
    """

    deterministic: bool = True
    decode: bool = False


class _SubLayers(nn.Module):
    """Residual connection + norm (``model.norm``) around a sub-layer, post-LN or pre-LN.

    Post-LN (the paper, Sec. 3.1/5.4): Norm(x + Dropout(Sublayer(x))).
    Pre-LN (tensor2tensor's later default): x + Dropout(Sublayer(Norm(x))).
    """

    config: TransformerConfig

    def residual(self, x: Array, sublayer, name: str, deterministic: bool) -> Array:
        cfg = self.config
        normalize = norm(cfg, f'{name}_norm')
        drop = Dropout(cfg.dropout_rate)
        if cfg.pre_layer_norm:
            return x + drop(sublayer(normalize(x)), deterministic=deterministic)
        return normalize(x + drop(sublayer(x), deterministic=deterministic))

    def attention(self, name: str) -> MultiHeadAttention:
        cfg = self.config
        return MultiHeadAttention(
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dropout_rate=cfg.attention_dropout_rate,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            use_bias=cfg.attention_bias,
            attention_impl=cfg.attention_impl,
            qk_norm=cfg.qk_norm,
            norm_epsilon=cfg.layer_norm_epsilon,
            position_encoding=variants.chosen(cfg, 'positions').module,
            scale=cfg.attention_scale,
            name=name,
        )

    def feed_forward(self) -> nn.Module:
        return variants.chosen(self.config, 'ffn').module(self.config, name='ffn')


class EncoderLayer(_SubLayers):
    """Self-attention then FFN, each wrapped in residual + LayerNorm (Sec. 3.1): x [B, S, D]
    -> [B, S, D]; ``inputs``: the self-attention's mask and positions."""

    @nn.compact
    def __call__(self, flags: LayerFlags, x: Array, inputs: AttentionInputs) -> Array:
        deterministic = flags.deterministic
        x = constrain(x, BETWEEN_LAYERS)
        attn = self.attention('self_attention')
        x = self.residual(
            x,
            lambda y: attn(y, None, inputs, deterministic=deterministic),
            'self_attention',
            deterministic,
        )
        ffn = self.feed_forward()
        x = self.residual(x, lambda y: ffn(y, deterministic), 'ffn', deterministic)
        return constrain(x, BETWEEN_LAYERS)


class DecoderLayer(_SubLayers):
    """Masked self-attention, encoder-decoder attention, FFN (Sec. 3.1): x [B, T, D] and the
    encoder's output [B, S, D] -> [B, T, D]; ``self_inputs``: the self-attention's mask and
    positions, ``cross_inputs``: the encoder-decoder attention's mask."""

    @nn.compact
    def __call__(
        self,
        flags: LayerFlags,
        x: Array,
        encoded: Array,
        self_inputs: AttentionInputs,
        cross_inputs: AttentionInputs,
    ) -> Array:
        deterministic, decode = flags.deterministic, flags.decode
        x, encoded = constrain(x, BETWEEN_LAYERS), constrain(encoded, BETWEEN_LAYERS)
        self_attn = self.attention('self_attention')
        x = self.residual(
            x,
            lambda y: self_attn(y, None, self_inputs, deterministic=deterministic, decode=decode),
            'self_attention',
            deterministic,
        )
        cross_attn = self.attention('cross_attention')
        # The encoder output is the same at every decoding step: its keys and values are
        # projected once, when the cache is created, not once per decoded position.
        x = self.residual(
            x,
            lambda y: cross_attn(
                y,
                encoded,
                cross_inputs,
                deterministic=deterministic,
                decode=decode,
                static_kv=True,
            ),
            'cross_attention',
            deterministic,
        )
        ffn = self.feed_forward()
        x = self.residual(x, lambda y: ffn(y, deterministic), 'ffn', deterministic)
        return constrain(x, BETWEEN_LAYERS)


class DecodePosition(nn.Module):
    """The position of the token decoded now, kept in the ``cache`` collection and advanced by
    one each call (the init call only creates it)."""

    @nn.compact
    def __call__(self) -> Array:
        is_initialized = self.has_variable('cache', 'position')
        position = self.variable('cache', 'position', lambda: jnp.array(0, jnp.int32))
        current = position.value
        if is_initialized:
            position.value = current + 1
        return current
