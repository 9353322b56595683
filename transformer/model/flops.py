"""Analytic FLOPs of a training step and the peak FLOP/s they are compared with (MFU).

FLOPs count the matrix products only (2 per multiply-add), on padded shapes, as the PaLM
paper's MFU does: the "6 * parameters * tokens" rule made exact for this encoder-decoder,
with the attention score and value products (encoder self, decoder self, decoder-encoder)
and the pre-softmax projection written out; each layer's weight products are those its
variants declare (transformer/model/variants.py). The backward pass costs twice the forward.
A position encoding adds no product: the sinusoids, the learned tables, rotary positions and
T5's relative position bias (a gather from its [buckets, N] table, one add per score) are
elementwise work, which the count leaves out as it leaves out the softmax's.
`tests/model/test_flops.py` checks the count against XLA's cost analysis of a jitted
forward + backward.
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp

from transformer import backends
from transformer.model import settings, variants
from transformer.model.config import TransformerConfig

# Dense peak FLOP/s per chip (vendor data sheets; SXM parts for NVIDIA), by dtype. Matched
# against `device.device_kind` by substring, first match wins.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ('H200', {'bfloat16': 989e12, 'float16': 989e12, 'float32': 67e12}),
    ('H100 PCIe', {'bfloat16': 756e12, 'float16': 756e12, 'float32': 51e12}),
    ('H100', {'bfloat16': 989e12, 'float16': 989e12, 'float32': 67e12}),
    ('A100', {'bfloat16': 312e12, 'float16': 312e12, 'float32': 19.5e12}),
    ('L4', {'bfloat16': 121e12, 'float16': 121e12, 'float32': 30e12}),
    ('V100', {'bfloat16': 0.0, 'float16': 125e12, 'float32': 15.7e12}),
    ('TPU v6', {'bfloat16': 918e12, 'float32': 918e12 / 4}),
    ('TPU v5p', {'bfloat16': 459e12, 'float32': 459e12 / 4}),
    ('TPU v5', {'bfloat16': 197e12, 'float32': 197e12 / 4}),  # v5e ("TPU v5 lite")
    ('TPU v4', {'bfloat16': 275e12, 'float32': 275e12 / 4}),
)


def forward_flops(cfg: TransformerConfig, batch: int, source_len: int, target_len: int) -> int:
    """Matmul FLOPs of one teacher-forced forward pass over [batch, S] -> [batch, T] tokens."""
    d, v = cfg.d_model, cfg.vocab_size
    nh = cfg.num_heads * settings.head_dim(cfg)
    s, t = batch * source_len, batch * target_len  # token rows
    # The weight products per token of the chosen variants (model/variants.py): q, k, v and
    # out; the feed-forward's; a norm's (none for LayerNorm, whose weights are vectors), one
    # per sub-layer and, with pre-LN, one closing each stack.
    # The key's and value's products run on the keys' tokens, the others (the query's, the
    # output's) on the queries' tokens: cross-attention's differ, and so do the two with
    # fewer key/value heads than query heads (model.num_kv_heads).
    projections = variants.matmul_flops_per_token(cfg, 'attention')
    on_keys = variants.matmul_flops_per_token(cfg, 'attention', ('key', 'value'))
    on_queries = projections - on_keys
    ffn = variants.matmul_flops_per_token(cfg, 'ffn')
    norm = variants.matmul_flops_per_token(cfg, 'norm')
    # Scores q k^T and probs v: 2 products of 2 * N * H per (query, key) pair, whatever the
    # key/value heads (each query head reads H values of its key).
    pairs = lambda q_len, k_len: batch * q_len * k_len * 2 * 2 * nh  # noqa: E731
    encoder_layer = s * (projections + ffn + 2 * norm) + pairs(source_len, source_len)
    decoder_self = t * projections + pairs(target_len, target_len)
    # Cross attention: queries and output on target tokens, keys and values on source tokens.
    decoder_cross = t * on_queries + s * on_keys + pairs(target_len, source_len)
    decoder_layer = decoder_self + decoder_cross + t * (ffn + 3 * norm)
    final_norms = (s + t) * norm if cfg.pre_layer_norm else 0
    final_norms += (s + t) * norm if cfg.layernorm_embedding else 0  # on the embedding sums
    return (
        cfg.num_encoder_layers * encoder_layer
        + cfg.num_decoder_layers * decoder_layer
        + final_norms
        + t * 2 * d * v
    )


def train_flops(cfg: TransformerConfig, batch: int, source_len: int, target_len: int) -> int:
    """Forward + backward (2x forward) matmul FLOPs of one training step."""
    return 3 * forward_flops(cfg, batch, source_len, target_len)


def accelerator_peak(device: jax.Device, dtype: str) -> float | None:
    """The table's dense peak FLOP/s of ``device`` in ``dtype``, or None if not listed."""
    kind = getattr(device, 'device_kind', '')
    for name, peaks in PEAK_FLOPS:
        if re.search(re.escape(name), kind, re.IGNORECASE):
            return peaks.get(dtype) or None
    return None


def measured_matmul_peak(n: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
    """Best-of-``repeats`` FLOP/s of a jitted n x n @ n x n matmul on the default device.

    The product is `backends.einsum`, the model's own: in bfloat16 on a CPU that is the
    bfloat16 kernel with float32 results, about twice the float32 rate.
    """
    x = jax.random.normal(jax.random.key(0), (n, n)).astype(dtype)
    matmul = jax.jit(lambda a, b: backends.einsum('ij,jk->ik', a, b))
    matmul(x, x).block_until_ready()
    best = float('inf')
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(x, x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def peak_flops(device: jax.Device, dtype: str) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from): the data-sheet table for a GPU/TPU, else measured."""
    if device.platform != 'cpu':
        peak = accelerator_peak(device, dtype)
        if peak:
            return peak, f'{device.device_kind} dense {dtype} data sheet'
    return measured_matmul_peak(dtype=dtype), f'measured jitted 2048^3 {dtype} matmul'
