"""Grouped-query attention (``model.num_kv_heads`` = K < N): against an explicit computation
written here, in which each key/value head is repeated for the N / K query heads it serves
(query head i reads key/value head i // (N / K)); through the model's cache, searches and
tensor-parallel layout; and K = N as the paper's model, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.model import test_masks
from tests.model.test_model import (
    encode_and_forward,
    forward,
    random_params,
    random_tokens,
    tiny_config,
)
from transformer import decoding
from transformer.backends import segment_attention
from transformer.model import PAD_ID, Transformer, flops, init_cache, param_shapes
from transformer.model.attention import MultiHeadAttention
from transformer.model.masks import dense

N, D = 4, 16  # head size 4


def repeated(x, num_kv_heads):
    """[B, S, K, H] -> [B, S, N, H]: head i is head i // (N / K), as GQA groups them."""
    return jnp.repeat(x, N // num_kv_heads, axis=2)


def wrong(x, num_kv_heads):
    """[B, S, K, H] -> [B, S, N, H] grouped the other way: head i is head i % K."""
    return jnp.tile(x, (1, 1, N // num_kv_heads, 1))


def explicit(params, x_q, x_kv, mask, group, num_kv_heads):
    """Multi-head attention written out, with the K key/value heads made N by ``group``."""
    p = params

    def project(x, name):
        return jnp.einsum('BTD,DNH->BTNH', x, p[name]['kernel']) + p[name]['bias']

    q = project(x_q, 'query') / jnp.sqrt(p['query']['kernel'].shape[-1])
    k = group(project(x_kv, 'key'), num_kv_heads)
    v = group(project(x_kv, 'value'), num_kv_heads)
    logits = jnp.einsum('BTNH,BSNH->BNTS', q, k)
    allowed = jnp.broadcast_to(dense(mask), logits.shape)
    logits = jnp.where(allowed, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1) * allowed  # a query with no key: zeros
    heads = jnp.einsum('BNTS,BSNH->BTNH', probs, v)
    return jnp.einsum('BTNH,NHD->BTD', heads, p['out']['kernel']) + p['out']['bias']


def _module(num_kv_heads, impl='einsum'):
    return MultiHeadAttention(N, num_kv_heads=num_kv_heads, use_bias=True, attention_impl=impl)


def _inputs(case):
    t, s, mask = test_masks._case(case)
    rng = np.random.default_rng(0)
    x_q = jnp.asarray(rng.standard_normal((3, t, D)), jnp.float32)
    x_kv = x_q if 'self' in case else jnp.asarray(rng.standard_normal((3, s, D)), jnp.float32)
    return x_q, x_kv, mask


def _params(num_kv_heads, x_q, x_kv):
    shapes = jax.eval_shape(lambda: _module(num_kv_heads).init(jax.random.key(0), x_q, x_kv))
    rng = np.random.default_rng(1)
    fill = lambda a: jnp.asarray(0.3 * rng.standard_normal(a.shape), jnp.float32)  # noqa: E731
    return jax.tree.map(fill, nn.unbox(shapes['params']))


def _value_and_grads(fn, params, x_q, x_kv):
    """fn's output and the gradients of its product with random cotangents."""
    cotangent = jnp.asarray(np.random.default_rng(2).standard_normal(x_q.shape), jnp.float32)

    def loss(*args):
        y = fn(*args)
        return jnp.sum(y * cotangent), y

    (_, y), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(params, x_q, x_kv)
    return y, grads


CASES = [
    'decoder self-attention, packed, causal',
    'cross-attention, padded',
    'cross-attention, packed',
]


@pytest.mark.parametrize(
    'impl, case, num_kv_heads',
    [
        ('einsum', CASES[0], 2),
        ('einsum', CASES[2], 1),
        ('fused', CASES[0], 1),
        ('fused', CASES[1], 2),
    ],
)
def test_outputs_and_gradients_equal_the_repeated_heads(impl, case, num_kv_heads):
    """Self- and cross-attention, packed rows, padding and causal masks: the module's output
    and its gradients (parameters, both inputs) are the explicit computation's to 1e-5 in
    float32, whose [D, K, H] kernels get the gradients of all the heads they serve; the other
    grouping (head i reading i % K) is a different function."""
    x_q, x_kv, mask = _inputs(case)
    params = _params(num_kv_heads, x_q, x_kv)
    assert params['key']['kernel'].shape == (D, num_kv_heads, D // N)
    self_attention = 'self' in case
    module = _module(num_kv_heads, impl)

    def run(p, q, kv):
        return module.apply({'params': p}, q, None if self_attention else kv, mask)

    def by(group):
        return lambda p, q, kv: explicit(
            p, q, q if self_attention else kv, mask, group, num_kv_heads
        )

    @jax.jit
    def all_three(p, q, kv):
        return (
            _value_and_grads(run, p, q, kv),
            _value_and_grads(by(repeated), p, q, kv),
            by(wrong)(p, q, kv),
        )

    with jax.default_matmul_precision('float32'):
        got, want, other = all_three(params, x_q, x_kv)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    if num_kv_heads > 1:
        assert np.abs(np.asarray(got[0]) - np.asarray(other)).max() > 1e-2


def test_attention_maps_stay_one_per_query_head():
    x_q, x_kv, mask = _inputs(CASES[1])
    module = _module(1)
    apply = lambda p: module.apply(  # noqa: E731
        {'params': p}, x_q, x_kv, mask, mutable=['intermediates']
    )
    _, state = jax.eval_shape(apply, _params(1, x_q, x_kv))
    (maps,) = state['intermediates']['attention_weights']
    assert maps.shape == (3, N, x_q.shape[1], x_kv.shape[1])  # [B, N, T, S]


def test_packed_self_attention_by_segments_repeats_the_key_value_heads(monkeypatch):
    """model.attention_impl='pallas' (Pallas's kernel, in its interpreter here) takes grouped
    heads as the explicit computation does."""
    monkeypatch.setattr(segment_attention, 'INTERPRET', True)
    x_q, _, mask = _inputs(CASES[0])
    params = _params(2, x_q, x_q)
    module = _module(2, 'pallas')
    run = lambda p, x: module.apply({'params': p}, x, None, mask)  # noqa: E731
    assert 'pallas_call' in str(jax.make_jaxpr(run)(params, x_q))
    with jax.default_matmul_precision('float32'):
        want = explicit(params, x_q, x_q, mask, repeated, 2)
        np.testing.assert_allclose(jax.jit(run)(params, x_q), want, atol=1e-5)


def test_kv_heads_equal_to_heads_is_the_papers_model_bit_for_bit():
    """num_kv_heads=N: the same parameter tree and the same program (jaxpr) as None, the
    paper's model, for the forward pass and its gradient."""
    paper, same = tiny_config(), tiny_config(num_kv_heads=4)
    assert param_shapes(paper) == param_shapes(same)
    params = random_params(paper)
    inputs, targets = random_tokens(1, (2, 5), [5, 3]), random_tokens(2, (2, 4), [4, 2])

    def program(cfg):
        loss = lambda p: forward(cfg, p, inputs, targets).sum()  # noqa: E731
        return str(jax.make_jaxpr(jax.grad(loss))(params)).replace(f'{cfg!r}', '')

    assert program(paper) == program(same)


@pytest.mark.parametrize('num_kv_heads', [2, 1])
def test_fewer_key_value_heads_save_the_flops_xla_counts(num_kv_heads):
    """The analytic count's saving from K < N (the key and value projections, on the source
    tokens in cross-attention) is XLA's, exactly: XLA's cost analysis of the lowered forward
    pass, K = N minus K."""
    b, s, t = 2, 6, 5
    inputs, targets = np.full((b, s), 5, np.int32), np.full((b, t), 7, np.int32)

    def counts(cfg):
        model, params = Transformer(cfg), random_params(cfg)
        apply = lambda p: model.apply({'params': p}, inputs, targets)  # noqa: E731
        xla = jax.jit(apply).lower(params).cost_analysis()
        return flops.forward_flops(cfg, b, s, t), float(xla['flops'])

    (ours_n, xla_n), (ours_k, xla_k) = (
        counts(tiny_config()),
        counts(tiny_config(num_kv_heads=num_kv_heads)),
    )
    assert ours_n - ours_k == xla_n - xla_k > 0


def test_cached_decoding_equals_the_full_forward_and_the_caches_hold_k_heads():
    cfg = tiny_config(num_kv_heads=1)
    model, params = Transformer(cfg), random_params(cfg)
    b, s, t = 2, 5, 4
    inputs, targets = random_tokens(3, (b, s), [5, 3]), random_tokens(4, (b, t), [4, 2])
    encoded, full = encode_and_forward(cfg, params, inputs, targets)
    cache = jax.jit(init_cache, static_argnums=(0, 4))(model, params, encoded, inputs, t)
    layer = cache['decoder_layer_0']
    assert layer['self_attention']['cached_key'].shape == (b, 1, t, 8)  # [B, K, T', H]
    assert layer['cross_attention']['cached_static_value'].shape == (b, 1, s, 8)

    @jax.jit
    def step(cache, token):
        return model.apply(
            {'params': params, 'cache': cache},
            encoded,
            inputs,
            token,
            decode=True,
            method=Transformer.decode,
            mutable=['cache'],
        )

    previous, stepwise = np.zeros((b, 1), np.int32), []
    for pos in range(t):
        logits, state = step(cache, previous)
        cache = state['cache']
        stepwise.append(np.asarray(logits[:, 0]))
        previous = targets[:, pos : pos + 1]
    real = targets != PAD_ID
    np.testing.assert_allclose(np.stack(stepwise, 1)[real], np.asarray(full)[real], atol=1e-5)


@pytest.mark.long
def test_greedy_and_beam_search_run_with_one_key_value_head():
    """Multi-query attention (K = 1) through both searches (beam search shares one cache
    between a source's beams). In the long tier: the cache of one key/value head decodes as
    the full forward (test_cached_decoding_equals_the_full_forward_and_the_caches_hold_k_heads),
    and both searches run over grouped heads' caches, beams sharing one, shrinking as examples
    end (tests/model/test_scan_layers.py::test_logits_and_decoding_equal_the_unrolled_models,
    num_kv_heads 2)."""
    cfg = tiny_config(num_kv_heads=1)
    model, params = Transformer(cfg), random_params(cfg)
    inputs = random_tokens(5, (2, 4), [4, 2])
    options = decoding.DecodeOptions(max_decode_len=4)
    greedy = np.asarray(decoding.greedy_search(model, params, inputs, options=options))
    beams, scores = decoding.beam_search(model, params, inputs, beam_size=2, options=options)
    assert greedy.shape == (2, 4) and np.asarray(beams).shape == (2, 2, 4)  # [B, beams, T]
    assert (greedy[:, 0] > PAD_ID).all() and (np.asarray(beams)[:, :, 0] > PAD_ID).all()
    assert np.isfinite(np.asarray(scores)).all()


def test_a_model_axis_of_two_equals_one_device():
    """K = 2 key/value heads split over a 'model' axis of 2 (one each), queries' heads too:
    the logits of one device."""
    from transformer.model import logical_partition_specs, logical_shardings
    from transformer.training import parallel

    cfg = tiny_config(num_kv_heads=2)
    model, params = Transformer(cfg), random_params(cfg)
    mesh = parallel.make_mesh(2, jax.devices('cpu')[:2])
    shardings = logical_shardings(logical_partition_specs(model), mesh, parallel.rules(False))
    kernel = shardings['encoder_layer_0']['self_attention']['key']['kernel']
    assert kernel.spec == jax.sharding.PartitionSpec(None, 'model', None)
    inputs, targets = random_tokens(6, (2, 5), [5, 3]), random_tokens(7, (2, 4), [4, 2])
    split = jax.device_put(params, shardings)
    assert split['encoder_layer_0']['self_attention']['key']['kernel'].addressable_shards[
        0
    ].data.shape == (32, 1, 8)
    with jax.default_matmul_precision('float32'):
        np.testing.assert_allclose(
            forward(cfg, split, inputs, targets), forward(cfg, params, inputs, targets), atol=1e-5
        )
