"""Tests of transformer/model/masks.py: the mask kept as its parts, its dense form, and the fused
path that hands unpacked rows to `jax.nn.dot_product_attention` as lengths and a causal flag.

On CPU the fused path runs XLA's implementation of `jax.nn.dot_product_attention` with the same
arguments cuDNN gets on a GPU, so these equivalences check what is handed over, not cuDNN.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer.model import attention_mask
from transformer.model.attention import MultiHeadAttention
from transformer.model.masks import AttentionMask, dense, fused_arguments

D, N = 16, 2


def _valid(lengths, size):
    return np.arange(size)[None, :] < np.asarray(lengths)[:, None]


def test_dense_mask_of_packed_causal_rows():
    """Real, same segment and causal, written out for one packed row and one padded row."""
    seg = np.array([[1, 1, 2, 0], [1, 1, 1, 0]])
    valid = seg > 0
    mask = np.asarray(attention_mask(valid, valid, seg, seg, causal=True).dense())
    expected = np.array(
        [
            [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]],
            [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]],
        ],
        bool,
    )
    assert mask.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(mask[:, 0], expected)
    unpacked = np.asarray(attention_mask(valid, _valid([2, 4], 5)).dense())
    np.testing.assert_array_equal(unpacked[0, 0], np.outer(valid[0], [1, 1, 0, 0, 0]))
    assert dense(None) is None and dense(expected) is expected


def test_unpacked_rows_go_as_lengths_and_packed_rows_as_the_dense_mask():
    """`fused_arguments` gives unpacked rows lengths (an empty row gets 1, its outputs zeroed)
    and is_causal, no mask; packed rows and plain arrays the dense mask."""
    q_valid, kv_valid = _valid([3, 0], 4), _valid([5, 2], 6)
    arguments, attends = fused_arguments(AttentionMask(q_valid, kv_valid), 2, 4, 6)
    assert set(arguments) == {'query_seq_lengths', 'key_value_seq_lengths', 'is_causal'}
    np.testing.assert_array_equal(arguments['query_seq_lengths'], [3, 1])
    np.testing.assert_array_equal(arguments['key_value_seq_lengths'], [5, 2])
    assert arguments['query_seq_lengths'].dtype == jnp.int32 and not arguments['is_causal']
    np.testing.assert_array_equal(attends[..., 0, 0], q_valid)
    causal = AttentionMask(q_valid, q_valid, causal=True)
    assert fused_arguments(causal, 2, 4, 4)[0]['is_causal']
    seg = np.array([[1, 1, 2, 2], [1, 1, 1, 0]])
    packed = AttentionMask(seg > 0, seg > 0, seg, seg, causal=True)
    arguments, attends = fused_arguments(packed, 2, 4, 4)
    assert set(arguments) == {'mask'}
    np.testing.assert_array_equal(arguments['mask'], packed.dense())
    np.testing.assert_array_equal(attends[..., 0, 0], seg > 0)
    assert set(fused_arguments(packed.dense(), 2, 4, 4)[0]) == {'mask'}
    assert fused_arguments(None, 2, 4, 4) == ({}, None)


CASES = (  # the kinds of attention `_case` makes
    'encoder self-attention, padded',
    'decoder self-attention, padded, causal',
    'cross-attention, padded',
    'decoder self-attention, packed, causal',
    'cross-attention, packed',
)


def _case(name: str):
    """(T, S, mask) of one kind of attention, rows of 3 with padding, one row empty."""
    t_lengths, s_lengths = [6, 2, 0], [5, 7, 3]
    if name == 'encoder self-attention, padded':
        return 7, 7, AttentionMask(_valid(s_lengths, 7), _valid(s_lengths, 7))
    if name == 'decoder self-attention, padded, causal':
        valid = _valid(t_lengths, 6)
        return 6, 6, AttentionMask(valid, valid, causal=True)
    if name == 'cross-attention, padded':
        return 6, 7, AttentionMask(_valid(t_lengths, 6), _valid(s_lengths, 7))
    t_seg = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 2, 2, 2, 2], [1, 2, 3, 0, 0, 0]])
    s_seg = np.array([[1, 1, 2, 2, 2, 0, 0], [1, 2, 2, 2, 2, 2, 2], [1, 1, 2, 2, 3, 0, 0]])
    if name == 'decoder self-attention, packed, causal':
        return 6, 6, AttentionMask(t_seg > 0, t_seg > 0, t_seg, t_seg, causal=True)
    return 6, 7, AttentionMask(t_seg > 0, s_seg > 0, t_seg, s_seg)  # packed cross-attention


@pytest.mark.parametrize('name', CASES)
def test_fused_attention_with_lengths_equals_einsum(name):
    """attention_impl='fused' fed an `AttentionMask` (lengths + is_causal for unpacked rows,
    the dense mask for packed ones) gives the einsum path's output and gradients to 1e-5 in
    float32; a query with no key (the empty row, padding) outputs the out-projection's bias."""
    t, s, mask = _case(name)
    rng = np.random.default_rng(0)
    x_q = jnp.asarray(rng.standard_normal((3, t, D)), jnp.float32)
    x_kv = x_q if s == t and 'self' in name else jnp.asarray(rng.standard_normal((3, s, D)))
    self_attention = x_kv is x_q
    einsum = MultiHeadAttention(num_heads=N, use_bias=True)
    fused = MultiHeadAttention(num_heads=N, use_bias=True, attention_impl='fused')
    params = nn.unbox(einsum.init(jax.random.key(1), x_q, x_kv)['params'])
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape), params)

    def loss(module, params, x_q, x_kv):
        y = module.apply({'params': params}, x_q, None if self_attention else x_kv, mask)
        return jnp.sum(y**2), y

    results = [
        jax.jit(jax.value_and_grad(functools.partial(loss, m), (0, 1, 2), has_aux=True))(
            params, x_q, x_kv
        )
        for m in (einsum, fused)
    ]
    (_, y_einsum), g_einsum = results[0]
    (_, y_fused), g_fused = results[1]
    np.testing.assert_allclose(y_fused, y_einsum, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_einsum), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    silent = ~np.asarray(mask.dense()).any(-1)[:, 0]  # [B, T]: queries with no key
    assert silent.any()
    bias = np.asarray(params['out']['bias'])
    np.testing.assert_allclose(
        np.asarray(y_fused)[silent], np.broadcast_to(bias, (silent.sum(), D))
    )
