"""transformer/backends/segment_attention.py: packed self-attention by Pallas's flash attention
with segment ids (``model.attention_impl='pallas'``), run here in Pallas's interpreter: the same
outputs and gradients as the einsum path, in float32."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.model import test_masks
from transformer.backends import segment_attention
from transformer.model.attention import MultiHeadAttention

D, N = 16, 2


def _loss(module, params, x, mask):
    y = module.apply({'params': params}, x, None, mask)
    return jnp.sum(y**2), y


def _outputs_and_grads(impl, x, mask, params):
    module = MultiHeadAttention(num_heads=N, use_bias=True, attention_impl=impl)
    fn = jax.value_and_grad(functools.partial(_loss, module), (0, 1), has_aux=True)
    (_, y), grads = fn(params, x, mask)
    jaxpr = str(jax.make_jaxpr(functools.partial(_loss, module))(params, x, mask))
    return y, grads, 'pallas_call' in jaxpr


@pytest.mark.parametrize(
    'name', ['decoder self-attention, packed, causal', 'encoder self-attention, packed']
)
def test_packed_self_attention_by_segments_equals_einsum(monkeypatch, name):
    """Rows of 2-3 packed examples with padding (one row full): outputs and the gradients of
    the parameters and inputs equal the einsum path's to 1e-5; padding outputs the
    out-projection's bias, as there; the kernel is a Pallas call."""
    monkeypatch.setattr(segment_attention, 'INTERPRET', True)
    t, _, mask = test_masks._case('decoder self-attention, packed, causal')
    if 'encoder' in name:
        mask = mask.replace(causal=False)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, t, D)), jnp.float32)
    params = nn.unbox(MultiHeadAttention(num_heads=N, use_bias=True).init(
        jax.random.key(1), x)['params'])  # fmt: skip
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape), params)
    y_ref, g_ref, _ = _outputs_and_grads('einsum', x, mask, params)
    y, grads, pallas = _outputs_and_grads('pallas', x, mask, params)
    assert pallas
    np.testing.assert_allclose(y, y_ref, atol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    padding = ~np.asarray(mask.query_valid)
    assert padding.any()
    bias = np.asarray(params['out']['bias'])
    np.testing.assert_allclose(np.asarray(y)[padding], np.broadcast_to(bias, (padding.sum(), D)))


def test_other_attention_and_backends_take_the_fused_path(monkeypatch):
    """Cross-attention, unpacked rows, a length the tiles do not divide, and a CPU without the
    interpreter: no Pallas call, the fused path's result."""
    t, s, cross = test_masks._case('cross-attention, packed')
    q = jnp.ones((3, t, N, 8))
    k = jnp.ones((3, s, N, 8))
    assert segment_attention.packed_self_attention(q, k, k, cross, scale=0.5) is None  # T != S
    _, _, unpacked = test_masks._case('decoder self-attention, padded, causal')
    assert segment_attention.packed_self_attention(q, q, q, unpacked, scale=0.5) is None
    _, _, packed = test_masks._case('decoder self-attention, packed, causal')
    if jax.default_backend() != 'gpu':
        assert segment_attention.packed_self_attention(q, q, q, packed, scale=0.5) is None
    monkeypatch.setattr(segment_attention, 'INTERPRET', True)
    assert segment_attention.packed_self_attention(q, q, q, packed, scale=0.5) is not None
    long = jnp.ones((3, 40, N, 8))  # 40: not a multiple of the 32-position backward tiles
    seg = jnp.ones((3, 40), jnp.int32)
    mask = packed.replace(query_valid=seg > 0, key_valid=seg > 0,
                          query_segmentation=seg, key_segmentation=seg)  # fmt: skip
    assert segment_attention.packed_self_attention(long, long, long, mask, scale=0.5) is None
