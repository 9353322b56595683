"""Tests of transformer/model/attention.py: the two views of one kernel, fans, masks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer.model.attention import MultiHeadAttention
from transformer.model.projections import (
    from_per_head,
    fused,
    fused_out,
    per_head,
    unfused,
    unfused_out,
)


def _init(module: MultiHeadAttention, x_q, x_kv, mask=None, seed=0):
    """The module's real initial parameters."""
    return nn.unbox(jax.jit(module.init)(jax.random.key(seed), x_q, x_kv, mask)['params'])


def _random_params(module: MultiHeadAttention, x_q, x_kv, seed=0):
    """Random values (biases included) on the module's real parameter tree.

    Cheaper than `_init` (no threefry initialisers to compile) and, unlike the zero initial
    biases, lets the equivalence tests see the biases.
    """
    shapes = jax.eval_shape(lambda: _init(module, x_q, x_kv))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.standard_normal(leaf.shape).astype(np.float32)
        if path[-1].key == 'bias':
            return 0.1 * noise
        fan_in = leaf.shape[0] * leaf.shape[1] if path[-2].key == 'out' else leaf.shape[0]
        return noise / np.sqrt(fan_in)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def _apply_sown(module: MultiHeadAttention, params, x_q, x_kv, mask):
    """Output and the ``intermediates`` collection (the sown attention weights)."""
    apply = jax.jit(
        lambda p, q, kv, m: module.apply({'params': p}, q, kv, m, mutable=['intermediates'])
    )
    return apply(params, x_q, x_kv, mask)


def _normal(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _softmax(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Float64 reference softmax over the last axis (every row has at least one True)."""
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _separate_heads_reference(params, x_q, x_kv, mask) -> np.ndarray:
    """The "h separate Linear layers" reading of Sec. 3.2.2, one head at a time in float64.

    head_i = softmax(x_q W_i^Q (x_kv W_i^K)^T / sqrt(H)) x_kv W_i^V with W_i = kernel[:, i, :],
    then Concat(head_1..head_N) W^O with W^O the [N*H, D] matrix (plus biases, if any).
    """
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x_q, x_kv = np.asarray(x_q, np.float64), np.asarray(x_kv, np.float64)
    num_heads, head_dim, _ = p['out']['kernel'].shape
    b, t, s = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    mask = None if mask is None else np.broadcast_to(mask, (b, num_heads, t, s))

    def linear(x, name, i):  # head i's own [D, H] layer W_i (and [H] bias)
        y = x @ p[name]['kernel'][:, i, :]
        return y + p[name]['bias'][i] if 'bias' in p[name] else y

    heads = []
    for i in range(num_heads):
        q = linear(x_q, 'query', i)  # [B, T, H]
        k, v = linear(x_kv, 'key', i), linear(x_kv, 'value', i)  # [B, S, H]
        logits = q @ k.transpose(0, 2, 1) / np.sqrt(head_dim)  # [B, T, S]
        heads.append(_softmax(logits, None if mask is None else mask[:, i]) @ v)
    concat = np.concatenate(heads, axis=-1)  # [B, T, N*H]
    return concat @ np.asarray(fused_out(p['out']['kernel'])) + p['out'].get('bias', 0.0)


def _one_big_linear_reference(params, x_q, x_kv, mask) -> np.ndarray:
    """The "one [D, N*H] Linear, then split the columns into heads" reading, in float64."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x_q, x_kv = np.asarray(x_q, np.float64), np.asarray(x_kv, np.float64)
    num_heads, head_dim, _ = p['out']['kernel'].shape
    b, t = x_q.shape[:2]

    def linear(x, name):  # one [D, N*H] layer with an [N*H] bias
        y = x @ fused(p[name]['kernel'])
        if 'bias' in p[name]:
            y = y + p[name]['bias'].reshape(-1)
        return y.reshape(*x.shape[:2], num_heads, head_dim)

    q, k, v = linear(x_q, 'query'), linear(x_kv, 'key'), linear(x_kv, 'value')
    logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(head_dim)
    mask = None if mask is None else np.broadcast_to(mask, logits.shape)
    heads = np.einsum('bnts,bsnh->btnh', _softmax(logits, mask), v)
    y = heads.reshape(b, t, num_heads * head_dim) @ np.asarray(fused_out(p['out']['kernel']))
    return y + p['out'].get('bias', 0.0)


@pytest.mark.parametrize(
    ('head_dim', 'with_mask', 'use_bias'),
    [(None, False, False), (None, True, False), (8, True, False), (8, False, True)],
)
def test_separate_heads_and_one_big_linear_equal_module(head_dim, with_mask, use_bias):
    """Both readings of the paper's W_i^Q (N separate [D, H] layers, or one [D, N*H] layer
    split into column blocks) compute exactly what the einsum module computes, also with a
    per-head mask, with biases, and with N*H != D (so the scale is sqrt(H), not sqrt(D/N))."""
    b, t, s, d, n = 2, 5, 7, 16, 4
    x_q, x_kv = _normal(0, (b, t, d)), _normal(1, (b, s, d))
    mask = None
    if with_mask:
        mask = np.random.default_rng(2).random((b, n, t, s)) < 0.5
        mask[..., 0] = True  # every query keeps one key: the references assume non-empty rows
    module = MultiHeadAttention(num_heads=n, head_dim=head_dim, use_bias=use_bias)
    params = _random_params(module, x_q, x_kv)
    assert ('bias' in params['out']) == use_bias
    y = np.asarray(jax.jit(module.apply)({'params': params}, x_q, x_kv, mask))
    assert y.shape == (b, t, d)
    np.testing.assert_allclose(y, _separate_heads_reference(params, x_q, x_kv, mask), atol=1e-5)
    np.testing.assert_allclose(y, _one_big_linear_reference(params, x_q, x_kv, mask), atol=1e-5)


def test_fused_matrix_is_one_big_matmul_and_column_block_i_is_head_i():
    """x @ fused(w), reshaped to [B, T, N, H], is the einsum with the 3-D kernel, and column
    block i of the fused [D, N*H] matrix is head i's own W_i = w[:, i, :]."""
    d, n, h = 16, 4, 8
    w, x = _normal(0, (d, n, h)), _normal(1, (2, 3, d))
    big = x @ fused(w)  # [B, T, N*H]
    assert fused(w).shape == (d, n * h)
    np.testing.assert_allclose(
        big.reshape(2, 3, n, h), jnp.einsum('BTD,DNH->BTNH', x, w), rtol=1e-6, atol=1e-6
    )
    for i in range(n):
        np.testing.assert_array_equal(fused(w)[:, i * h : (i + 1) * h], per_head(w)[i])
        np.testing.assert_array_equal(per_head(w)[i], w[:, i, :])
        np.testing.assert_allclose(
            big[..., i * h : (i + 1) * h], x @ w[:, i, :], rtol=1e-6, atol=1e-6
        )


def test_view_helpers_round_trip():
    """per_head/from_per_head, fused/unfused and fused_out/unfused_out are exact inverses, and
    row block i of W^O = fused_out(w_o) is w_o[i]."""
    d, n, h = 16, 4, 8
    w, w_o = _normal(0, (d, n, h)), _normal(1, (n, h, d))
    assert per_head(w).shape == (n, d, h)
    assert fused_out(w_o).shape == (n * h, d)
    np.testing.assert_array_equal(from_per_head(per_head(w)), w)
    np.testing.assert_array_equal(unfused(fused(w), n), w)
    np.testing.assert_array_equal(unfused_out(fused_out(w_o), n), w_o)
    m = _normal(2, (d, n * h))
    np.testing.assert_array_equal(fused(unfused(m, n)), m)
    np.testing.assert_array_equal(fused_out(unfused_out(m.T, n)), m.T)
    for i in range(n):
        np.testing.assert_array_equal(fused_out(w_o)[i * h : (i + 1) * h], w_o[i])


def test_parameter_count_is_4_d_n_h_and_independent_of_heads():
    """The module's real params number 4*D*N*H: 4*D^2 for every N when H = D/N, so splitting
    into heads costs no parameters; with an explicit H it follows N*H, not D."""
    d_model = 64
    x = jnp.zeros((1, 1, d_model))

    def count(**kwargs) -> int:
        shapes = jax.eval_shape(lambda: _init(MultiHeadAttention(**kwargs), x, x))
        return sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(shapes))

    for n in (1, 2, 4, 8, 16):
        assert count(num_heads=n) == 4 * d_model * n * (d_model // n) == 4 * d_model**2, n
    assert count(num_heads=4, head_dim=8) == 4 * d_model * 4 * 8


def test_kernel_init_is_glorot_with_the_2d_fans():
    """q/k/v kernels [D, N, H] have variance 2/(D + N*H) and the out kernel [N, H, D]
    2/(N*H + D), within 5 standard errors, and stay inside the Glorot-uniform bound; the
    fans jax would assume for a 3-D kernel (in_axis=-2, out_axis=-1) are far outside."""
    d, n, h = 256, 8, 32
    x = jnp.zeros((1, 1, d))
    params = _init(MultiHeadAttention(num_heads=n, head_dim=h), x, x)
    # Uniform(-a, a): var = a^2/3, 4th moment a^4/5, so Var(sample var) = 0.8 var^2 / count.
    fan_sum = d + n * h
    expected = 2.0 / fan_sum
    for name in ('query', 'key', 'value', 'out'):
        w = np.asarray(params[name]['kernel'], np.float64)
        assert w.shape == ((n, h, d) if name == 'out' else (d, n, h))
        tolerance = 5 * expected * np.sqrt(0.8 / w.size)
        var = float(np.mean(w**2))
        assert abs(var - expected) < tolerance, (name, var, expected)
        assert np.abs(w).max() <= np.sqrt(6.0 / fan_sum) * (1 + 1e-6), name
        assert abs(float(w.mean())) < 5 * np.sqrt(expected / w.size), name
        # Default fans for a 3-D kernel: receptive field = leading axes.
        receptive = int(np.prod(w.shape[:-2]))
        wrong = 2.0 / (receptive * (w.shape[-2] + w.shape[-1]))
        assert abs(wrong - expected) > 10 * tolerance, name


def test_random_masks_never_give_nan_and_empty_rows_give_zero():
    """Random boolean masks, fully masked query rows included, give finite outputs and
    gradients; a query that may attend to nothing outputs exactly zero (no biases), and the
    sown [B, N, T, S] attention weights are zero where masked and rows sum to 1 (0 if empty)."""
    b, t, s, d, n = 3, 6, 5, 16, 2
    x_q, x_kv = _normal(3, (b, t, d)), _normal(4, (b, s, d))
    mask = np.random.default_rng(5).random((b, 1, t, s)) < 0.4
    mask[0, 0, 2] = False  # at least one fully masked query row
    mask[1] = False  # a whole example with no valid key
    mask[2, 0, 3] = True
    empty = ~mask[:, 0].any(-1)  # [B, T]
    assert empty.any() and not empty.all()

    module = MultiHeadAttention(num_heads=n)
    params = _random_params(module, x_q, x_kv)
    y, state = _apply_sown(module, params, x_q, x_kv, mask)
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(np.asarray(y)[empty], 0.0)
    assert np.abs(np.asarray(y)[~empty]).max(axis=-1).min() > 0

    (probs,) = state['intermediates']['attention_weights']
    probs = np.asarray(probs)
    assert probs.shape == (b, n, t, s)
    np.testing.assert_array_equal(probs[~np.broadcast_to(mask, probs.shape)], 0.0)
    np.testing.assert_allclose(
        probs.sum(-1), np.broadcast_to(np.where(empty, 0.0, 1.0)[:, None], (b, n, t)), atol=1e-6
    )

    def loss(params, x_q, x_kv):
        return jnp.sum(module.apply({'params': params}, x_q, x_kv, mask) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, x_q, x_kv)
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))


def test_attention_weights_rows_sum_to_one_without_mask():
    """Unmasked, every sown [B, N, T, S] row is a distribution (sums to 1, all positive)."""
    x_q, x_kv = _normal(0, (2, 3, 16)), _normal(1, (2, 4, 16))
    module = MultiHeadAttention(num_heads=4)
    params = _random_params(module, x_q, x_kv)
    _, state = _apply_sown(module, params, x_q, x_kv, None)
    (probs,) = state['intermediates']['attention_weights']
    assert probs.shape == (2, 4, 3, 4)
    assert (probs > 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_fused_attention_equals_einsum_with_empty_rows_and_self_attention():
    """attention_impl='fused' (jax.nn.dot_product_attention) gives the einsum path's output
    and gradients to 1e-5 under random masks with fully masked rows, which stay exactly zero,
    for cross-attention and for self-attention (the fused QKV projection)."""
    b, t, s, d, n = 3, 6, 5, 16, 2
    x_q, x_kv = _normal(3, (b, t, d)), _normal(4, (b, s, d))
    mask = np.random.default_rng(5).random((b, 1, t, s)) < 0.4
    mask[0, 0, 2] = False
    mask[1] = False
    self_mask = np.random.default_rng(6).random((b, 1, t, t)) < 0.5
    self_mask[2, 0, 1] = False
    empty = ~mask[:, 0].any(-1)
    einsum = MultiHeadAttention(num_heads=n, use_bias=True)
    fused_impl = MultiHeadAttention(num_heads=n, use_bias=True, attention_impl='fused')
    params = _random_params(einsum, x_q, x_kv)
    for kv, m in ((x_kv, mask), (x_q, self_mask)):

        def loss(module, params, x_q, x_kv, m=m, self_attention=kv is x_q):
            x_kv = None if self_attention else x_kv
            y = module.apply({'params': params}, x_q, x_kv, m)
            return jnp.sum(y**2), y

        outs = [
            jax.jit(jax.value_and_grad(functools.partial(loss, module), (0, 1), has_aux=True))(
                params, x_q, kv
            )
            for module in (einsum, fused_impl)
        ]
        (_, y_e), g_e = outs[0]
        (_, y_f), g_f = outs[1]
        np.testing.assert_allclose(y_f, y_e, atol=1e-5)
        for a, c in zip(
            jax.tree_util.tree_leaves(g_f), jax.tree_util.tree_leaves(g_e), strict=True
        ):
            assert np.isfinite(a).all()
            np.testing.assert_allclose(a, c, atol=1e-5)
        if kv is x_kv:  # an empty row outputs the out-projection's bias alone
            bias = np.asarray(params['out']['bias'])
            np.testing.assert_allclose(
                np.asarray(y_f)[empty], np.broadcast_to(bias, (empty.sum(), d)), atol=1e-6
            )


def test_decode_step_query_rows_share_static_cache_rows():
    """A decoding step whose G*B query rows read a static cache of B rows (beam search: the K
    beams of a source share its encoder keys/values) equals ordinary attention of every
    query row to its own copy of the source, under a padding mask."""
    b, g, s, d, n = 2, 3, 5, 16, 2
    x_kv, x_q = _normal(7, (b, s, d)), _normal(8, (b * g, 1, d))
    mask = np.random.default_rng(9).random((b * g, 1, 1, s)) < 0.6
    mask[:, :, :, 0] = True
    module = MultiHeadAttention(num_heads=n, use_bias=True)
    repeated = np.repeat(x_kv, g, axis=0)  # [B*G, S, D]: each query row's own source
    params = _random_params(module, x_q, repeated)

    @jax.jit
    def step(params, x_q, x_kv, mask):
        _, made = module.apply(
            {'params': params}, x_q[::g], x_kv, decode=True, static_kv=True, mutable=['cache']
        )
        assert made['cache']['cached_static_key'].shape[0] == b
        return module.apply(
            {'params': params, 'cache': made['cache']},
            x_q,
            x_kv,
            mask,
            decode=True,
            static_kv=True,
            mutable=['cache'],
        )[0]

    expected = jax.jit(module.apply)({'params': params}, x_q, repeated, mask)
    np.testing.assert_allclose(step(params, x_q, x_kv, mask), expected, atol=1e-5)
    with pytest.raises(ValueError, match='do not share'):
        step(params, x_q[:-1], x_kv, mask[:-1])


def test_auto_is_einsum_on_a_cpu_and_fused_on_a_gpu(monkeypatch):
    """attention_impl='auto' (the configs' default) takes the einsum path where the backend is
    a CPU, which sows the weights, and the fused path where it is a GPU, which sows none; each
    branch runs once under its own backend name, whatever machine this is (float32, so the
    fused path is XLA's and the outputs equal)."""
    from transformer.backends import platform

    x_q, x_kv = _normal(0, (2, 3, 16)), _normal(1, (2, 4, 16))
    module = MultiHeadAttention(num_heads=4, attention_impl='auto')
    params = _random_params(module, x_q, x_kv)
    outputs = {}
    for backend, sows in (('cpu', True), ('gpu', False)):
        monkeypatch.setattr(platform.jax, 'default_backend', lambda b=backend: b)
        outputs[backend], state = _apply_sown(module, params, x_q, x_kv, None)
        assert ('attention_weights' in state.get('intermediates', {})) is sows, backend
    monkeypatch.undo()
    want = {'cpu': 'einsum', 'gpu': 'fused'}.get(jax.default_backend(), 'einsum')
    assert platform.attention_impl('auto') == want
    np.testing.assert_allclose(outputs['gpu'], outputs['cpu'], atol=1e-5)


def test_self_attention_is_asked_for_by_no_inputs_kv():
    """``inputs_kv=None`` is self-attention, its three projections one einsum of the
    concatenated kernels; the same array passed as ``inputs_kv`` is attention to a copy of
    the queries, projected apart, to the same output. A static key/value cache of
    self-attention is refused."""
    x = _normal(10, (2, 5, 16))
    module = MultiHeadAttention(num_heads=2, use_bias=True)
    params = _random_params(module, x, x)
    mask = np.tril(np.ones((5, 5), bool))[None, None]
    apply = lambda kv: module.apply({'params': params}, x, kv, mask)  # noqa: E731
    np.testing.assert_allclose(apply(None), apply(x), atol=1e-6)
    dots = lambda kv: str(jax.make_jaxpr(apply)(kv)).count('dot_general')  # noqa: E731
    assert dots(None) == dots(x) - 1  # q, k, v in one product instead of q and (k, v)
    with pytest.raises(ValueError, match='self-attention has none'):
        module.apply({'params': params}, x, None, decode=True, static_kv=True, mutable=['cache'])
