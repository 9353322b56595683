"""T5's relative position buckets (Raffel et al., 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer", Sec. 2.1): ``model.positions='t5_relative'``.

Nothing is added to the embeddings. Each self-attention's logits get a learned scalar per head
for the distance from the query to the key, key position - query position, read from a table
[buckets, N] that every layer of a stack shares (`RelativePositionBias`: the encoder's and the
decoder's, ``encoder_positions/bias`` and ``decoder_positions/bias``, outside the layers, so
``model.scan_layers`` keeps one copy of each). Distances fall into
``model.relative_attention_num_buckets`` buckets (`relative_position_buckets`): the encoder's
are bidirectional (half the buckets for keys after the query), the decoder's causal (keys
after the query are masked anyway); half of each side's buckets hold one distance each, the
others logarithmically wider ranges up to ``model.relative_attention_max_distance``, from
which every distance shares the last bucket. Cross-attention gets no bias. The bias is added
to the logits through `dot_product.attend`'s ``bias``. (T5 does not scale the logits either:
``model.attention_scale=1.0``, a setting of its own; its initialization scales the queries
instead.)

Positions are the model's: 0, 1, 2, ... in a row, each packed example's own from 0
(transformer/model/packing.py), so a packed row's bias is its examples' own. In cached
decoding the step's query position meets the positions of every key in the self-attention
cache, which this module keeps in the cache beside it (``key_positions``, [B, T'] from
`init_cache`, every row alike; a cache shared by K beams holds K keys per position,
`cache.share_across_beams`).

Shape legend (transformer/model/attention.py): B batch · T query positions · S key positions ·
N heads.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.model import cache as cache_layout
from transformer.model import positions, variants
from transformer.model.config import TransformerConfig

Array = jax.Array
# The logical name of the table's bucket axis (replicated: transformer/training/parallel.py);
# its other axis is the heads'.
BUCKETS_AXIS = 'relpos_buckets'


def _bucket_of(distance: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int):
    """The bucket of each key position - query position in ``distance`` (int64), in float32
    op by op as Hugging Face's T5Attention._relative_position_bucket (Mesh TensorFlow's)."""
    buckets = np.zeros_like(distance)
    if bidirectional:  # keys after the query take the upper half
        num_buckets //= 2
        buckets += (distance > 0) * num_buckets
        n = np.abs(distance)
    else:  # only keys at or before the query count
        n = -np.minimum(distance, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide='ignore'):  # log(0), at distances the exact buckets hold
        wider = (
            np.log(n.astype(np.float32) / np.float32(max_exact))
            / np.float32(math.log(max_distance / max_exact))
            * np.float32(num_buckets - max_exact)
        )
    wider = max_exact + np.where(n < max_exact, 0, wider).astype(np.int64)
    return buckets + np.where(n < max_exact, n, np.minimum(wider, num_buckets - 1))


@functools.cache
def _buckets_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """The bucket of every distance from -max_distance to max_distance, int32: any farther
    distance shares its side's last bucket with the nearest of them."""
    distances = np.arange(-max_distance, max_distance + 1)
    return _bucket_of(distances, bidirectional, num_buckets, max_distance).astype(np.int32)


def relative_position_buckets(
    distance: Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Array:
    """The bucket [0, num_buckets) of each key position - query position in ``distance``
    (integers, any shape), as Hugging Face's ``T5Attention._relative_position_bucket``.

    The buckets of the distances up to ``max_distance`` either way are computed once, on the
    host, in float32 as there (numpy's log; tests/model/test_relative_positions.py checks
    every distance from -300 to 300 against Hugging Face's at (32, 128) and (8, 20)), and
    looked up: every backend then gives the same buckets, which a device's own log, one ulp
    off at a bucket's edge, would not. numpy's float32 log and torch's differ by an ulp too
    at a few arguments, which moves a distance lying exactly on a bucket's edge: at no
    distance of T5's sizes (32, 128), nor of nearly all others: of the 122,472 cases of
    4-129 buckets, a max_distance from past half of them to 519 and either direction, 53
    differ somewhere from -300 to 300.
    """
    table = jnp.asarray(_buckets_table(bidirectional, num_buckets, max_distance))
    return table[jnp.clip(distance, -max_distance, max_distance) + max_distance]


class RelativePositionBias(nn.Module):
    """One stack's logits bias: a table ``bias`` [buckets, N] (logical axes
    ('relpos_buckets', 'heads')), read at the bucket of each key position - query position.

    Attributes:
      config: the model's.
      bidirectional: the encoder's buckets (keys after the query apart); False: causal.
    """

    config: TransformerConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, query_positions: Array, decode: bool = False) -> Array:
        """The bias [B, N, T, S] of self-attention over tokens at ``query_positions`` [B, T]
        (B may be 1, the rows sharing their positions), in the model's dtype.

        ``decode``: the keys are the self-attention cache's, at the positions kept in the
        ``cache`` collection, [B, S] (made by the call that makes the cache, from its queries'
        count, for each of its rows); the rows share their positions and the bias is [1, N,
        T, S]. Else the keys are the queries."""
        cfg = self.config
        num_buckets = cfg.relative_attention_num_buckets
        table = self.param(
            'bias',
            nn.with_logical_partitioning(
                nn.initializers.normal(cfg.d_model**-0.5), (BUCKETS_AXIS, 'heads')
            ),
            (num_buckets, cfg.num_heads),
            cfg.param_dtype,
        )
        key_positions = query_positions
        if decode:
            # One row per cache row, all alike: the searches take and shard a cache's arrays
            # by their rows (transformer/decoding/next_token.py `take_examples`).
            cached = self.variable(
                'cache',
                cache_layout.KEY_POSITIONS,
                lambda: jnp.broadcast_to(
                    jnp.arange(query_positions.shape[1], dtype=jnp.int32), query_positions.shape
                ),
            )
            query_positions, key_positions = query_positions[:1], cached.value[:1]
        buckets = relative_position_buckets(
            key_positions[:, None, :] - query_positions[:, :, None],
            bidirectional=self.bidirectional,
            num_buckets=num_buckets,
            max_distance=cfg.relative_attention_max_distance,
        )  # [B, T, S]
        bias = jnp.take(table, buckets, axis=0).astype(cfg.dtype)  # [B, T, S, N]
        return jnp.moveaxis(bias, -1, 1)


def stack_bias(cfg: TransformerConfig, stack: str, name: str) -> RelativePositionBias:
    """The bias module of ``stack`` ('encoder': bidirectional, 'decoder': causal)."""
    return RelativePositionBias(cfg, bidirectional=stack == 'encoder', name=name)


def _buckets_fit(cfg: TransformerConfig) -> str | None:
    """Each side's exact buckets must be one or more, and the wider ones reach past them."""
    num_buckets = cfg.relative_attention_num_buckets
    max_distance = cfg.relative_attention_max_distance
    if num_buckets < 4:
        return (
            f'model.relative_attention_num_buckets={num_buckets} leaves the encoder no exact '
            'bucket on each side: set it to 4 or more (T5: 32).'
        )
    if max_distance <= num_buckets // 2:
        return (
            f'model.relative_attention_max_distance={max_distance} must exceed half of '
            f'model.relative_attention_num_buckets={num_buckets}, where the wider buckets '
            'start (T5: 128 for 32).'
        )
    return None


def _no_float16(cfg: TransformerConfig) -> str | None:
    """T5's activations overflow float16 (no sqrt(D) scale, unscaled logits)."""
    for key in ('dtype', 'param_dtype'):
        if jnp.dtype(getattr(cfg, key)) == jnp.float16:
            return (
                f"model.{key}=float16 overflows a model.positions='t5_relative' model's "
                "activations (as T5's do): use 'bfloat16' or 'float32'."
            )
    return None


def _check(cfg: TransformerConfig) -> str | None:
    return _no_float16(cfg) or _buckets_fit(cfg)


T5_RELATIVE = variants.register(
    variants.Variant(
        'positions',
        't5_relative',
        variants.nothing,
        'T5 (Raffel et al., 2020): a learned bias per head and relative position bucket on '
        "self-attention's logits, one table per stack; Hugging Face's T5Attention",
        module=positions.PositionEncoding(added=False, rotary=False, stack_bias=stack_bias),
        outer=lambda cfg: {
            f'{stack}_positions/bias': (cfg.relative_attention_num_buckets, cfg.num_heads)
            for stack in variants.SUBLAYERS
        },
        check=positions.unused_sizes_refused(_check, reads=positions.BUCKET_SIZES),
    )
)
