"""The embedding lookup's gradients (transformer/model/embedding.py): every variant equals
autodiff's scatter, the one-hot products' program holds no scatter, and 'auto' resolves to the
measured winner of the backend."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model
from transformer.backends import platform
from transformer.model import embedding

V, D = 50, 16
CUSTOM = ('one_hot', 'sorted_scatter')


def _table_tokens_cotangent(seed: int = 0):
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(V, D)), jnp.float32)
    # 21 tokens from 6 ids: every used row gets several additions; rows 6..V-1 get none.
    tokens = jnp.asarray(rng.integers(0, 6, size=(3, 7)))
    cotangent = jnp.asarray(rng.normal(size=(3, 7, D)), jnp.float32)
    return table, tokens, cotangent


def _gradient(grad, table, tokens, cotangent, dtype):
    def loss(t, k, c):
        return (embedding.lookup(t, k, dtype, grad).astype(jnp.float32) * c).sum()

    return jax.grad(loss)(table, tokens, cotangent)


@pytest.mark.parametrize('grad', CUSTOM)
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_every_gradient_equals_the_scatter(monkeypatch, grad, dtype):
    """Same rows forward, same [V, D] gradient (float32, as the table) back, with one-hot
    blocks that do not divide the 21 tokens; the bfloat16 cotangent is summed in float32."""
    monkeypatch.setattr(embedding, 'GRAD_BLOCK_TOKENS', 4)
    table, tokens, cotangent = _table_tokens_cotangent()
    np.testing.assert_array_equal(
        embedding.lookup(table, tokens, dtype, grad), embedding.take_lookup(table, tokens, dtype)
    )
    assert embedding.lookup(table, tokens, dtype, grad).dtype == dtype
    want = _gradient('scatter', table, tokens, cotangent, dtype)
    got = _gradient(grad, table, tokens, cotangent, dtype)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    manual = np.zeros((V, D), np.float32)
    np.add.at(manual, np.asarray(tokens), np.float32(np.asarray(cotangent).astype(dtype)))
    np.testing.assert_allclose(got, manual, rtol=1e-5, atol=1e-5)
    assert np.abs(manual[:6]).min() > 0 and not manual[6:].any()


def test_an_unknown_gradient_is_refused():
    table, tokens, _ = _table_tokens_cotangent()
    with pytest.raises(ValueError, match="model.embedding_grad='dense' must be one of"):
        embedding.lookup(table, tokens, jnp.float32, 'dense')


def _scatters(grad) -> list[str]:
    table, tokens, cotangent = _table_tokens_cotangent()

    def loss(t, k, c):
        return (embedding.lookup(t, k, jnp.float32, grad) * c).sum()

    # The program as lowered, before the backend compiler: what a CPU compiles a scatter into
    # depends on XLA's code generators (one fused op by default, a loop of updates under
    # --xla_cpu_use_fusion_emitters=false).
    text = jax.jit(jax.grad(loss)).lower(table, tokens, cotangent).as_text()
    return re.findall(r'stablehlo\.scatter', text)


def test_the_one_hot_gradient_holds_no_scatter():
    """The program of the gather's gradient holds a scatter; the one-hot product's none."""
    assert _scatters('scatter')
    assert not _scatters('one_hot')


def test_auto_is_the_measured_winner_of_each_backend(monkeypatch):
    """'auto' resolves through `platform.WINNERS` (the scatter on every backend measured so
    far); a named variant is taken as named on every backend."""
    for backend in ('cpu', 'gpu', 'tpu'):
        monkeypatch.setattr(platform.jax, 'default_backend', lambda b=backend: b)
        table = platform.WINNERS['embedding_grad']
        assert platform.embedding_grad('auto') == table.get(backend, table['*']), backend
        assert platform.embedding_grad('one_hot') == 'one_hot'
    assert platform.embedding_grad('auto') in embedding.EMBEDDING_GRADS


@functools.cache
def _compiled_gradient(name: str):
    """(the whole model's compiled gradient with ``model.embedding_grad=name``, its random
    parameters): compiled once for every test that compares with it (the scatter's)."""
    batch = packed_batch(3)
    weights = np.random.default_rng(5).standard_normal((*batch['targets'].shape, 32))
    model = tiny_model(embedding_grad=name)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'], batch['targets'])
    params = fill_random(nn.unbox(shapes['params']), seed=4)

    def loss(p):
        return (model.apply({'params': p}, batch['inputs'], batch['targets']) * weights).sum()

    return jax.jit(jax.grad(loss)).lower(params).compile(), params


@pytest.mark.parametrize('grad', CUSTOM)
def test_transformer_gradients_equal_with_every_lookup(grad):
    """The whole model's gradients with ``model.embedding_grad=grad`` equal those of the
    scatter (the shared matrix adds source, target and projection uses); the one-hot
    products leave no scatter in the compiled gradient."""
    reference, params = _compiled_gradient('scatter')
    variant, _ = _compiled_gradient(grad)
    if grad == 'one_hot':
        assert not re.findall(r'\sscatter\(', variant.as_text())
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(variant(params)),
        jax.tree_util.tree_leaves(reference(params)),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=str(path))
