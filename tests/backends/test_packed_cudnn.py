"""transformer/backends/packed_cudnn.py: packed rows as cuDNN's segment lengths and offsets
(``model.attention_impl='cudnn_packed'``). Here, without a GPU: the layout of hand-built rows,
the attention those four arrays describe against einsum attention under the segment mask, the
layout as jax flattens it for cuDNN (no segment of one row lined up with another row's), and
the fallback to the fused path. tests/backends/test_gpu.py runs cuDNN itself."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer.backends import packed_cudnn
from transformer.model.attention import MultiHeadAttention, masked_softmax
from transformer.model.masks import AttentionMask


def _layout(q_seg, kv_seg=None, max_segments=4):
    q_seg = jnp.asarray(q_seg, jnp.int32)
    kv_seg = q_seg if kv_seg is None else jnp.asarray(kv_seg, jnp.int32)
    layout = packed_cudnn.segment_layout(q_seg, kv_seg, max_segments)
    return [np.asarray(x).tolist() for x in layout]


def test_layout_of_tail_padding_a_one_token_segment_and_an_empty_row():
    """Self-attention rows: two segments and tail padding; a one-token segment first; one
    segment filling the row; all padding (every slot -1). Fewer segments than M = 4: the
    remaining slots and the last offset are -1."""
    rows = [
        [1, 1, 1, 2, 2, 0, 0],
        [1, 2, 2, 3, 3, 3, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0],
    ]
    q_len, kv_len, q_off, kv_off = _layout(rows)
    assert q_len == kv_len == [[3, 2, -1, -1], [1, 2, 3, -1], [7, -1, -1, -1], [-1] * 4]
    assert (
        q_off
        == kv_off
        == [
            [0, 3, -1, -1, -1],
            [0, 1, 3, -1, -1],
            [0, -1, -1, -1, -1],
            [-1] * 5,
        ]
    )


def test_cross_attention_layout_keeps_both_sides_on_the_same_slots():
    """Source and target segmentations of different lengths: each side's own offsets, the
    same slots; an id on one side only gets length 0 at the row's end on the other side, so
    that jax's dropping of -1 slots cannot shift one side against the other."""
    q_len, kv_len, q_off, kv_off = _layout(
        [[1, 1, 2, 0], [1, 1, 0, 0]], [[1, 2, 2, 2, 2, 0], [1, 2, 2, 0, 0, 0]], max_segments=3
    )
    assert q_len == [[2, 1, -1], [2, 0, -1]]
    assert kv_len == [[1, 4, -1], [1, 2, -1]]
    assert q_off == [[0, 2, -1, -1], [0, 4, -1, -1]]
    assert kv_off == [[0, 1, -1, -1], [0, 1, -1, -1]]


def test_more_segments_than_slots_is_flagged_and_fewer_than_two_slots_refused():
    seg = jnp.asarray([[1, 2, 3, 3, 0]], jnp.int32)
    q_len, _, q_off, _ = _layout(seg, max_segments=2)
    assert q_len == [[1, 1]] and q_off == [[0, 1, -1]]  # segment 3 is in no slot ...
    assert bool(packed_cudnn.overflows((seg, seg), 2))  # ... and the batch says so
    assert not bool(packed_cudnn.overflows((seg, seg), 3))
    with pytest.raises(ValueError, match='max_segments must be >= 2'):
        packed_cudnn.segment_layout(seg, seg, 1)


def _random_packed(rng, rows, length, most):
    """[rows, length] contiguous segments 1..k of random lengths, then padding; the last row
    all padding."""
    seg = np.zeros((rows, length), np.int32)
    for r in range(rows - 1):
        at, segment = 0, 1
        while segment <= most:
            size = int(rng.integers(1, 5))
            if at + size > length:
                break
            seg[r, at : at + size] = segment
            at, segment = at + size, segment + 1
        if r == 0:  # one row filled to the end
            seg[r, at:] = segment - 1
    return seg


def _einsum_attention(q, k, v, mask):
    logits = jnp.einsum('BTNH,BSNH->BNTS', q, k) * q.shape[-1] ** -0.5
    return jnp.einsum('BNTS,BSNH->BTNH', masked_softmax(logits, mask), v)


@pytest.mark.parametrize('kind', ['self, causal', 'self', 'cross'])
def test_reference_attention_of_the_layout_equals_einsum_under_the_segment_mask(kind):
    """Random packed rows (one full, one empty, one-token segments likely; cross-attention:
    a source of another length and segment sizes): the attention the layout describes equals
    einsum attention under `AttentionMask`'s dense mask, to float32 rounding, padding and all."""
    rng = np.random.default_rng(0)
    t, s = 16, (16 if kind != 'cross' else 20)
    q_seg = _random_packed(rng, 5, t, most=5)
    kv_seg = q_seg if kind != 'cross' else _random_packed(rng, 5, s, most=5)
    if kind == 'cross':  # the same examples on both sides, as packing makes them
        kv_seg = np.where(kv_seg <= q_seg.max(1, keepdims=True), kv_seg, 0)
    q, k, v = (jnp.asarray(rng.normal(size=(5, n, 2, 8)), jnp.float32) for n in (t, s, s))
    mask = AttentionMask(q_seg > 0, kv_seg > 0, q_seg, kv_seg, causal=kind == 'self, causal')
    layout = packed_cudnn.segment_layout(jnp.asarray(q_seg), jnp.asarray(kv_seg), 6)
    got = packed_cudnn.reference_attention(q, k, v, layout, mask.causal)
    np.testing.assert_allclose(got, _einsum_attention(q, k, v, mask), atol=1e-5)
    attends = np.asarray(packed_cudnn.attends(layout, t))[:, :, 0, 0]
    np.testing.assert_array_equal(attends, np.asarray(mask.dense()).any(-1)[:, 0])


def test_jax_flattening_of_the_layout_lines_up_the_same_segments():
    """The layout through jax's own conversion to cuDNN's form (offsets into the flattened
    [B * T] buffers, -1 slots dropped): the i-th query segment and the i-th key segment are
    the same row's same segment id, for every i (a segment one side lacks is empty there);
    nothing of one row meets another's."""
    cudnn = pytest.importorskip('jax._src.cudnn.fused_attention_stablehlo')
    fix = getattr(cudnn, '_fix_seqlen_offsets', None)
    if fix is None:
        pytest.skip('this jax has no _fix_seqlen_offsets: the flattening moved')
    q_seg = np.array([[1, 1, 2, 0, 0], [0, 0, 0, 0, 0], [1, 2, 2, 3, 0]], np.int32)
    kv_seg = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 2, 3]], np.int32)  # row 0: no id 2
    layout = packed_cudnn.segment_layout(jnp.asarray(q_seg), jnp.asarray(kv_seg), 4)
    q, k = jnp.zeros((3, 5, 1, 1)), jnp.zeros((3, 4, 1, 1))  # N = H = 1: offsets in tokens
    q_len, kv_len, q_off, kv_off = (np.asarray(x).ravel() for x in jax.jit(fix)(*layout, q, k))

    def segments(lengths, offsets, seg):
        found, flat = [], seg.ravel()
        for length, offset in zip(lengths, offsets, strict=False):
            if length < 0 or offset >= flat.size:
                continue
            ids = set(flat[offset : offset + length].tolist())
            found.append((offset // seg.shape[1], ids) if length else None)
        return found

    q_found = segments(q_len, q_off, q_seg)
    kv_found = segments(kv_len, kv_off, kv_seg)
    assert len(q_found) == len(kv_found) == 5 and kv_found[1] is None
    assert [row for row, _ in q_found] == [0, 0, 2, 2, 2]
    for q_segment, kv_segment in zip(q_found, kv_found, strict=True):
        if kv_segment is not None:
            assert q_segment == kv_segment and len(q_segment[1]) == 1


def test_cudnn_packed_takes_the_fused_path_off_a_gpu():
    """Off a GPU (and for unpacked rows anywhere) `packed_attention` declines and
    ``attention_impl='cudnn_packed'`` computes exactly what 'fused' does."""
    seg = np.array([[1, 1, 2, 2, 2, 0], [1, 2, 3, 0, 0, 0]], np.int32)
    mask = AttentionMask(seg > 0, seg > 0, seg, seg, causal=True)
    q = jnp.ones((2, 6, 2, 8), jnp.bfloat16)
    fallback = functools.partial(pytest.fail, 'the fallback is the caller to take')
    unpacked = AttentionMask(seg > 0, seg > 0)
    assert packed_cudnn.packed_attention(q, q, q, unpacked, fallback) is None
    if jax.default_backend() != 'gpu':
        assert packed_cudnn.packed_attention(q, q, q, mask, fallback) is None
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 16)), jnp.float32)
    params = jax.jit(MultiHeadAttention(num_heads=2).init)(jax.random.key(0), x, x)['params']

    def apply(impl):
        module = MultiHeadAttention(num_heads=2, attention_impl=impl)
        return jax.jit(lambda p: module.apply({'params': p}, x, x, mask))(nn.unbox(params))

    outputs = {impl: apply(impl) for impl in ('fused', 'cudnn_packed')}
    if jax.default_backend() != 'gpu':
        np.testing.assert_array_equal(outputs['cudnn_packed'], outputs['fused'])
