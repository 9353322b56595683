"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Shape legend (see also transformer/model/attention.py):

    B batch · T target (query) positions · S source (key/value) positions · D d_model
    N heads · H head dim (d_k) · F d_ff · V vocabulary

Token ids: the vocabulary's special ids, ``config.special`` (transformer/tokens.py `SpecialIds`):
its pad is masked and its decoder start begins the shifted-right target (the joint vocabulary's 0
for both). Every parameter declares logical axis names where it is created ('embed', 'heads', 'kv',
'mlp', 'vocab'); ``model.init`` returns them boxed (``nn.LogicallyPartitioned``).
The rest of the package calls the network through transformer/model/functional.py, which hands
out plain arrays and the specs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.model import embedding as embedding_lib
from transformer.model import layer_stack, variants
from transformer.model.config import TransformerConfig
from transformer.model.dropout import Dropout
from transformer.model.layers import (
    DecodePosition,
    DecoderLayer,
    EncoderLayer,
    LayerFlags,
    attention_mask,
    norm,
    partitioned,
    shift_right,
)
from transformer.model.masks import AttentionInputs
from transformer.model.output_head import OutputHead
from transformer.model.packing import Packing
from transformer.model.remat import rematerialized

Array = jax.Array


class Transformer(nn.Module):
    """Encoder-decoder Transformer with (optionally) tied embeddings.

    Parameter tree (share_embeddings='all'): ``shared_embedding/embedding [V, D]``,
    ``encoder_layer_{i}/...``, ``decoder_layer_{i}/...`` (with ``model.scan_layers``:
    ``encoder_layers/...``, ``decoder_layers/...``, each leaf stacked [L, ...]); with
    ``model.logits_bias``, ``logits_bias [V]``; with pre-LN, ``encoder_norm``,
    ``decoder_norm``; with ``model.layernorm_embedding``, ``encoder_embedding_norm``,
    ``decoder_embedding_norm``; with a learned position table, ``encoder_positions`` and
    ``decoder_positions`` (``embedding``, [max_positions + 2, D]), or T5's relative position
    bias tables (``bias``, [buckets, N]) under the same names. The same [V, D] matrix
    embeds the source and target tokens and, transposed, is the pre-softmax projection
    (Sec. 3.4; the output head, transformer/model/output_head.py);
    transformer/model/variants.py `param_shapes` lists every path.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        # N(0, D^-1/2) so that embeddings scaled by sqrt(D) have unit variance.
        embed = lambda name: nn.Embed(  # noqa: E731
            cfg.vocab_size,
            cfg.d_model,
            embedding_init=partitioned(
                nn.initializers.normal(stddev=cfg.d_model**-0.5), ('vocab', 'embed')
            ),
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            name=name,
        )
        if cfg.share_embeddings in ('all', 'inputs'):  # 'inputs': the head has its own
            self.source_embedding = self.target_embedding = embed('shared_embedding')
        else:
            self.source_embedding = embed('source_embedding')
            self.target_embedding = embed('target_embedding')
        # The pre-softmax projection (Sec. 3.4): its parameters at the root, beside the
        # embeddings it may share (transformer/model/output_head.py).
        self.output_head = OutputHead(cfg)
        nn.share_scope(self, self.output_head)
        # model.remat: each layer recomputed in the backward pass as the policy says; its
        # flags (LayerFlags: deterministic, decode), its first argument, are static.
        encoder_layer = rematerialized(EncoderLayer, cfg.remat)
        decoder_layer = rematerialized(DecoderLayer, cfg.remat)
        if cfg.scan_layers:  # one module per stack, its parameters stacked: `_layers`
            self.encoder_layers = encoder_layer(cfg, name=layer_stack.stacked_name('encoder'))
            self.decoder_layers = decoder_layer(cfg, name=layer_stack.stacked_name('decoder'))
        else:
            self.encoder_layers = [
                encoder_layer(cfg, name=f'encoder_layer_{i}') for i in range(cfg.num_encoder_layers)
            ]
            self.decoder_layers = [
                decoder_layer(cfg, name=f'decoder_layer_{i}') for i in range(cfg.num_decoder_layers)
            ]
        if cfg.pre_layer_norm:
            # Pre-LN leaves the residual stream un-normalised; a final norm closes it.
            self.encoder_norm = norm(cfg, 'encoder_norm')
            self.decoder_norm = norm(cfg, 'decoder_norm')
        self.embed_dropout = Dropout(cfg.dropout_rate)
        self.token_dropout = Dropout(cfg.token_dropout_rate)
        self.decode_position = DecodePosition(name='decode_position')
        # model.positions (transformer/model/positions.py): added here or rotated in attention.
        # Or a bias on self-attention's logits, one module per stack outside its layers.
        self.position_encoding = encoding = variants.chosen(cfg, 'positions').module
        if encoding.stack_module is not None:  # one per stack: it may hold a table
            self.encoder_positions = encoding.stack_module(cfg, name='encoder_positions')
            self.decoder_positions = encoding.stack_module(cfg, name='decoder_positions')
        elif encoding.stack_bias is not None:
            self.encoder_positions = encoding.stack_bias(cfg, 'encoder', name='encoder_positions')
            self.decoder_positions = encoding.stack_bias(cfg, 'decoder', name='decoder_positions')
        else:
            self.encoder_positions = self.decoder_positions = None
        if cfg.layernorm_embedding:  # mBART's norm of each stack's embedding sum
            self.encoder_embedding_norm = norm(cfg, 'encoder_embedding_norm')
            self.decoder_embedding_norm = norm(cfg, 'decoder_embedding_norm')

    def _embed(
        self, stack: str, tokens: Array, positions: Array, valid: Array, deterministic: bool
    ) -> Array:
        """The input [B, T, D] of ``stack`` ('encoder', 'decoder'): ``tokens`` [B, T]
        embedded at ``positions`` [B, T]; ``valid`` [B, T] is false at padding."""
        cfg = self.config
        encoder = stack == 'encoder'
        embedding = self.source_embedding if encoder else self.target_embedding
        # positions.PositionEncoding.stack_module's, or None: the encoding's ``embed``.
        added_positions = None
        if self.position_encoding.stack_module is not None:
            added_positions = self.encoder_positions if encoder else self.decoder_positions
        # Embeddings are multiplied by sqrt(d_model) (Sec. 3.4; as they are where
        # model.scale_embedding is False), then positions are added (by the sinusoidal
        # encoding, Sec. 3.5), the sum normed where model.layernorm_embedding (mBART) and
        # dropped out (Sec. 5.4).
        rows = embedding_lib.lookup(embedding.embedding, tokens, cfg.dtype, cfg.embedding_grad)
        if not deterministic and cfg.token_dropout_rate:
            # Word dropout: one keep decision per token, scaled (in float32) as dropout is, so
            # a dropped token is its position alone.
            keep = self.token_dropout(jnp.ones((*tokens.shape, 1), jnp.float32), False)
            rows = (rows * keep).astype(cfg.dtype)
        x = rows * jnp.sqrt(cfg.d_model).astype(cfg.dtype) if cfg.scale_embedding else rows
        if added_positions is None:
            x = self.position_encoding.embed(x, positions)
        else:
            x = added_positions(x, positions, valid)
        if cfg.layernorm_embedding:
            x = (self.encoder_embedding_norm if encoder else self.decoder_embedding_norm)(x)
        return self.embed_dropout(x, deterministic=deterministic)

    def encode(
        self, inputs: Array, *, packing: Packing | None = None, deterministic: bool = True
    ) -> Array:
        """The encoder: source tokens [B, S] -> [B, S, D]. ``packing``: several examples a
        row (`Packing`), None: one; ``deterministic=False`` enables dropout."""
        if packing is None:
            positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
            segments = None
        else:
            positions, segments = packing.inputs_positions, packing.inputs_segmentation
        valid = inputs != self.config.special.pad
        mask = attention_mask(valid, valid, segments, segments)
        x = self._embed('encoder', inputs, positions, valid, deterministic)
        bias = self._position_bias('encoder', positions, packing is not None)
        flags, attention_inputs = LayerFlags(deterministic), AttentionInputs(mask, positions, bias)
        x = self._layers(
            self.encoder_layers, self.config.num_encoder_layers, flags, x, attention_inputs
        )
        if self.config.pre_layer_norm:
            x = self.encoder_norm(x)
        return x

    def decode(
        self,
        encoded: Array,
        inputs: Array,
        targets: Array,
        *,
        packing: Packing | None = None,
        deterministic: bool = True,
        decode: bool = False,
        cache_mask: Array | None = None,
        logits: bool = True,
    ) -> Array:
        """The decoder and the pre-softmax projection: logits [B, T, V]; position t predicts
        ``targets[:, t]``.

        Args:
          encoded: encoder output [B, S, D]. With ``decode=True`` only the call that creates
            the cache reads it (`functional.init_cache`); the steps read its keys and values
            from the cache.
          inputs: source tokens [B, S] (for the padding mask of cross-attention).
          targets: target tokens [B, T]; shifted right here. With ``decode=True`` it is
            instead the single previous token [B, 1] (the decoder's start token at the first
            step, `SpecialIds.decoder_start`), not shifted.
          packing: several examples a row (`Packing`), None: one.
          deterministic: False enables dropout.
          decode: one step of autoregressive decoding with the key/value cache.
          cache_mask: with ``decode``, boolean [B, 1, 1, S'] over the self-attention cache's
            keys: which of them each row may attend to (beam search's rows sharing cache rows,
            `attention.MultiHeadAttention._update_cache`); None = all written ones.
          logits: False gives the decoder's last hidden states [B, T, D] instead (after the
            final LayerNorm of pre-LN), which `output_projection` maps to the logits.

        Returns:
          float32 logits [B, T, V], or the hidden states in the model's dtype.
        """
        if decode:
            positions = jnp.full(targets.shape, self.decode_position())
            decoder_inputs = targets
            valid = jnp.ones(targets.shape, bool)  # the step's token is a real one
            self_mask = cache_mask  # the cache itself masks the positions not yet written
            source_valid = inputs != self.config.special.pad
            cross_mask = attention_mask(valid, source_valid)
        else:
            positions, self_mask, cross_mask = self._teacher_forcing_masks(inputs, targets, packing)
            segments = None if packing is None else packing.targets_segmentation
            decoder_inputs = shift_right(targets, segments, start=self.config.special.decoder_start)
            valid = self_mask.query_valid  # the targets': the leading start token is real
        y = self._embed('decoder', decoder_inputs, positions, valid, deterministic)
        flags = LayerFlags(deterministic, decode)
        bias = self._position_bias('decoder', positions, packing is not None, decode)
        self_inputs = AttentionInputs(self_mask, positions, bias)
        cross_inputs = AttentionInputs(cross_mask)  # never rotated: the keys are the source's
        y = self._layers(
            self.decoder_layers,
            self.config.num_decoder_layers,
            flags,
            y,
            encoded,
            self_inputs,
            cross_inputs,
        )
        if self.config.pre_layer_norm:
            y = self.decoder_norm(y)
        return self.output_head(y, self.target_embedding.embedding) if logits else y

    def _position_bias(
        self, stack: str, positions: Array, packed: bool, decode: bool = False
    ) -> Array | None:
        """The bias of ``stack``'s self-attention logits by relative position (T5's,
        transformer/model/relative_positions.py): [B, N, T, S] for packed rows, [1, N, T, S]
        where the rows share their positions (unpacked, or decoding, whose cache keeps the
        keys' positions for each row); None where the positions are no bias."""
        if self.position_encoding.stack_bias is None:
            return None
        module = self.encoder_positions if stack == 'encoder' else self.decoder_positions
        return module(positions if packed or decode else positions[:1], decode)

    def _layers(self, layers, count: int, flags: LayerFlags, x: Array, *inputs) -> Array:
        """``x`` through a stack's layers, each called as ``layer(flags, x, *inputs)``: one
        after the other (a list), or, with ``model.scan_layers``, one `nn.scan` of the stack's
        one module over ``count`` layers, every variable collection (parameters, the decoding
        cache, the sown attention weights) stacked on a leading layer axis and each layer
        drawing its own dropout masks."""
        if not self.config.scan_layers:
            for layer in layers:
                x = layer(flags, x, *inputs)
            return x
        scanned = nn.scan(
            lambda layer, carry, *xs: (layer(flags, carry, *xs), None),
            variable_axes={True: 0},
            split_rngs={True: True},
            in_axes=(nn.broadcast,) * len(inputs),
            length=count,
            metadata_params={nn.PARTITION_NAME: layer_stack.LAYER_AXIS},
        )
        return scanned(layers, x, *inputs)[0]

    def _teacher_forcing_masks(self, inputs: Array, targets: Array, packing: Packing | None):
        """Target positions, the causal self-attention mask and the cross-attention mask."""
        if packing is None:
            positions = jnp.broadcast_to(jnp.arange(targets.shape[1]), targets.shape)
            source_segments = target_segments = None
        else:
            positions = packing.targets_positions
            source_segments = packing.inputs_segmentation
            target_segments = packing.targets_segmentation
        # Validity comes from the targets being predicted: the shifted input's leading start
        # token may be the padding id (the joint vocabulary's 0) but is a real position.
        pad = self.config.special.pad
        target_valid = targets != pad
        self_mask = attention_mask(
            target_valid, target_valid, target_segments, target_segments, causal=True
        )
        cross_mask = attention_mask(target_valid, inputs != pad, target_segments, source_segments)
        return positions, self_mask, cross_mask

    def output_projection(self) -> tuple[Array, Array | None]:
        """The pre-softmax projection as a [V, D] matrix W and its bias [V] (None without
        one), as stored: logits = y W^T + b of ``decode(..., logits=False)``'s hidden states y
        (`output_head.OutputHead.projection`), for losses that never form the [B, T, V] logits
        (transformer/training/loss.py)."""
        return self.output_head.projection(self.target_embedding.embedding)

    def __call__(
        self,
        inputs: Array,
        targets: Array,
        *,
        packing: Packing | None = None,
        deterministic: bool = True,
        logits: bool = True,
    ) -> Array:
        """Teacher-forced logits [B, T, V] for source [B, S] and target [B, T] tokens
        (`encode`, then `decode`; ``logits=False``: the decoder's hidden states [B, T, D])."""
        encoded = self.encode(inputs, packing=packing, deterministic=deterministic)
        return self.decode(
            encoded, inputs, targets, packing=packing, deterministic=deterministic, logits=logits
        )
