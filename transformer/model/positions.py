"""How positions enter the network, one `variants.Variant` each (``model.positions``).

Shape legend (transformer/model/attention.py): B batch · T positions · D d_model · N heads ·
H head dim.

An entry's module is a `PositionEncoding`, which acts at one of three places:

* on the scaled embeddings [B, T, D] before their dropout, either by ``embed`` (the paper's
  sinusoids, Sec. 3.5, added there) or by its ``stack_module``, one Flax module per stack,
  for encodings that read the config or hold parameters: fairseq's sinusoids, whose positions
  start past the padding id (the vocabulary's, ``config.special.pad``) and leave padding at
  zero; BART's and mBART's learned table, whose rows are parameters.
* ``rotate``: on self-attention's queries [B, T, N, H] and keys [B, T, K, H] after their
  projections (and QK-norm), before their product. Rotary positions (Su et al., 2021,
  "RoFormer") turn each pair of channels (j, j + H/2) of a head by the angle
  position * 10000^(-2j/H), so that q_t . k_s depends on t - s alone.
* ``stack_bias``: on self-attention's logits, a bias by the keys' positions relative to the
  query's, one Flax module per stack shared by its layers (T5's buckets,
  transformer/model/relative_positions.py).

All read the positions of the tokens as the model gives them: 0, 1, 2, ... in a row, each
packed example's own from 0 (transformer/model/packing.py), the step's position in cached
decoding. Cross-attention's queries and keys are never rotated: its keys are the source's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.model import settings, variants
from transformer.model.config import TransformerConfig

Array = jax.Array
# The base of the frequencies of both encodings (Sec. 3.5; RoFormer keeps it).
BASE = 10000.0
# The rows before position 0 in BART's and mBART's learned tables (Hugging Face's
# MBartLearnedPositionalEmbedding.offset): fairseq's padding id + 1, kept though unread.
LEARNED_OFFSET = 2


def sinusoidal_positions(positions: Array, d_model: int) -> Array:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (Sec. 3.5).

    Computed from the positions themselves, so packed rows (positions restarting at 0) and
    any length work without a precomputed table.

    Args:
      positions: integer positions, any shape [...].
      d_model: D (even).

    Returns:
      [..., D] float32, sin at even and cos at odd channels, interleaved as in the paper.
    """
    inv_freq = 1.0 / (BASE ** (np.arange(0, d_model, 2, dtype=np.float32) / d_model))
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., D/2]
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)


def fairseq_sinusoids(ids: Array, d_model: int) -> Array:
    """Rows ``ids`` of fairseq's sinusoid table (its SinusoidalPositionalEmbedding,
    transformers' M2M100SinusoidalPositionalEmbedding): half = D // 2 frequencies
    exp(-i ln(10000) / (half - 1)), the row laid out [sin | cos] (concatenated, not
    interleaved as Sec. 3.5's), a zero channel last where D is odd.

    Args:
      ids: integer row ids, any shape [...] (the position past the padding id).
      d_model: D (>= 4).

    Returns:
      [..., D] float32.
    """
    half = d_model // 2
    inv_freq = np.exp(np.arange(half) * -(math.log(BASE) / (half - 1))).astype(np.float32)
    angles = ids[..., None].astype(jnp.float32) * inv_freq  # [..., D/2]
    rows = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.pad(rows, [(0, 0)] * ids.ndim + [(0, d_model % 2)])


class FairseqSinusoids(nn.Module):
    """fairseq's sinusoids added to one stack's embeddings: a real token at position p (0, 1,
    ... from the start of its example) takes row p + pad + 1 of `fairseq_sinusoids`, as fairseq
    numbers positions past the padding id (`cumsum(ids != pad) * mask + pad`, Hugging Face's
    create_position_ids_from_input_ids); padding takes the padding id's row, zero."""

    config: TransformerConfig

    def __call__(self, x: Array, positions: Array, valid: Array) -> Array:
        rows = fairseq_sinusoids(positions + self.config.special.pad + 1, x.shape[-1])
        return x + jnp.where(valid[..., None], rows, 0.0).astype(x.dtype)


class OffsetLearnedPositions(nn.Module):
    """A learned table [max_positions + 2, D] added to one stack's embeddings (BART's and
    mBART's, Hugging Face's MBartLearnedPositionalEmbedding): position p (0, 1, ... from its
    example's start, the step's in cached decoding) takes row p + 2, padding included; rows 0
    and 1 are never read. A position past the table reads NaN (jnp.take's fill), which the
    loss shows at once."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, positions: Array, valid: Array) -> Array:
        del valid  # the positions count padding as tokens
        cfg = self.config
        table = self.param(
            'embedding',
            nn.with_logical_partitioning(nn.initializers.normal(0.02), ('positions', 'embed')),
            (cfg.max_positions + LEARNED_OFFSET, cfg.d_model),
            cfg.param_dtype,
        )
        rows = jnp.take(table, positions + LEARNED_OFFSET, axis=0, mode='fill', fill_value=jnp.nan)
        return x + rows.astype(x.dtype)


def rotate_half_pairs(x: Array, positions: Array) -> Array:
    """x [B, T, N, H] with channels j and j + H/2 of each head turned by position * theta_j,
    theta_j = 10000^(-2j/H) (the half-split layout, CTranslate2's rotary_interleave=False):
    (a, b) -> (a cos - b sin, b cos + a sin). Computed in float32, returned in x's dtype.
    ``positions``: [B, T] integers."""
    half = x.shape[-1] // 2
    theta = 1.0 / (BASE ** (np.arange(half, dtype=np.float32) * 2 / x.shape[-1]))
    angles = positions.astype(jnp.float32)[:, :, None, None] * theta  # [B, T, 1, H/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    a, b = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class PositionEncoding:
    """One way of giving the network its tokens' positions (see the module docstring).

    Attributes:
      added: the sinusoids are added to the embeddings.
      rotary: self-attention's queries and keys are rotated.
      stack_module: None, or what adds positions to one stack's embeddings instead of
        ``embed``: ``stack_module(config, name=...)``, a Flax module called as
        ``(x [B, T, D], positions [B, T], valid [B, T]) -> [B, T, D]``, ``valid`` false at
        padding; its parameters, if any, under its name ('encoder_positions',
        'decoder_positions').
      stack_bias: None, or what gives one stack's self-attention logits a bias instead:
        ``stack_bias(config, stack, name=...)`` for ``stack`` 'encoder' or 'decoder', a Flax
        module called as ``(positions [B, T], decode) -> [B, N, T, S]``
        (transformer/model/relative_positions.py); its parameters under the same names
        (an entry has a ``stack_module`` or a ``stack_bias``, not both).
    """

    added: bool
    rotary: bool
    stack_module: Callable[..., nn.Module] | None = None
    stack_bias: Callable[..., nn.Module] | None = None

    def embed(self, x: Array, positions: Array) -> Array:
        """The scaled embeddings x [B, T, D] with the positions [B, T] added, or as they are."""
        if not self.added:
            return x
        return x + sinusoidal_positions(positions, x.shape[-1]).astype(x.dtype)

    def rotate(self, q: Array, k: Array, positions: Array | None) -> tuple[Array, Array]:
        """Self-attention's q [B, T, N, H] and k [B, T, K, H] rotated by ``positions`` [B, T]
        (None: cross-attention, never rotated), or as they are."""
        if not self.rotary or positions is None:
            return q, k
        return rotate_half_pairs(q, positions), rotate_half_pairs(k, positions)


def _even_head_dim(cfg: variants.TransformerConfig) -> str | None:
    head_dim = cfg.head_dim or cfg.d_model // cfg.num_heads
    if head_dim % 2 == 0:
        return None
    return (
        f"model.positions='rope' turns pairs of a head's channels, so the head size must be "
        f'even, not {head_dim}; set model.head_dim (or d_model / num_heads) to an even number.'
    )


def _even_d_model(cfg: variants.TransformerConfig) -> str | None:
    if cfg.d_model % 2 == 0:
        return None
    return f'model.d_model={cfg.d_model} must be even for sinusoidal positions (sin, cos pairs).'


# The sizes of the encodings that have them: a learned table's rows, T5's buckets
# (transformer/model/relative_positions.py). An entry that reads none of a kind refuses it set.
TABLE_SIZE = ('max_positions',)
BUCKET_SIZES = ('relative_attention_num_buckets', 'relative_attention_max_distance')
_SIZED = {
    **dict.fromkeys(TABLE_SIZE, 'a learned position table'),
    **dict.fromkeys(BUCKET_SIZES, "T5's relative position buckets"),
}


def unused_sizes_refused(check, reads: tuple[str, ...] = ()):
    """``check`` of an entry that reads only the sizes ``reads``: first every other size set
    away from its default (`settings.Setting`) is refused, since nothing would read it."""

    def checked(cfg: variants.TransformerConfig) -> str | None:
        defaults = {s.field: s.default for s in settings.declared()}
        for key, sizes in _SIZED.items():
            value = getattr(cfg, key)
            if key not in reads and value != defaults[key]:
                return (
                    f'model.{key}={value} sizes {sizes}, and model.positions={cfg.positions!r} '
                    f'has none: leave {key} {defaults[key]}.'
                )
        return check(cfg)

    return checked


def _half_above_one(cfg: variants.TransformerConfig) -> str | None:
    if cfg.d_model >= 4:
        return None
    return (
        f"model.d_model={cfg.d_model} is too narrow for model.positions='fairseq_sinusoidal', "
        'whose D // 2 frequencies divide by D // 2 - 1: set d_model to 4 or more.'
    )


SINUSOIDAL = variants.register(
    variants.Variant(
        'positions',
        'sinusoidal',
        variants.nothing,
        'Sec. 3.5: sinusoids added to the scaled embeddings',
        module=PositionEncoding(added=True, rotary=False),
        check=unused_sizes_refused(_even_d_model),
    )
)
ROPE = variants.register(
    variants.Variant(
        'positions',
        'rope',
        variants.nothing,
        'RoFormer (Su et al., 2021): self-attention queries and keys rotated, half-split pairs',
        module=PositionEncoding(added=False, rotary=True),
        check=unused_sizes_refused(_even_head_dim),
    )
)
FAIRSEQ_SINUSOIDAL = variants.register(
    variants.Variant(
        'positions',
        'fairseq_sinusoidal',
        variants.nothing,
        "fairseq's SinusoidalPositionalEmbedding (M2M100, NLLB-200): [sin | cos] rows from "
        'the padding id + 1, padding zero',
        module=PositionEncoding(added=False, rotary=False, stack_module=FairseqSinusoids),
        check=unused_sizes_refused(_half_above_one),
    )
)


def _table_size(cfg: variants.TransformerConfig) -> str | None:
    if cfg.max_positions is not None:
        return None
    return (
        "model.positions='bart_learned' learns a table of model.max_positions rows: set it "
        "(mBART's max_position_embeddings, 1024)."
    )


BART_LEARNED = variants.register(
    variants.Variant(
        'positions',
        'bart_learned',
        variants.nothing,
        "BART's and mBART's learned table (MBartLearnedPositionalEmbedding): row position + 2",
        module=PositionEncoding(added=False, rotary=False, stack_module=OffsetLearnedPositions),
        # One table per stack, [max_positions + 2, D].
        outer=lambda cfg: {
            f'{stack}_positions/embedding': (cfg.max_positions + LEARNED_OFFSET, cfg.d_model)
            for stack in variants.SUBLAYERS
        },
        check=unused_sizes_refused(_table_size, reads=TABLE_SIZE),
    )
)
