"""The embedding lookup's two gradients (transformer/model/embedding.py): equal, and one of them
compiled without a scatter."""

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


def _table_tokens_cotangent(seed: int = 0):
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(V, D)), jnp.float32)
    # 21 tokens from 6 ids: every used row gets several additions; rows 6..V-1 get none.
    tokens = jnp.asarray(rng.integers(0, 6, size=(3, 7)))
    cotangent = jnp.asarray(rng.normal(size=(3, 7, D)), jnp.float32)
    return table, tokens, cotangent


def _gradient(lookup, table, tokens, cotangent, dtype):
    def loss(t, k, c):
        return (lookup(t, k, dtype).astype(jnp.float32) * c).sum()

    return jax.grad(loss)(table, tokens, cotangent)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_scatter_free_gradient_equals_scatter_gradient(monkeypatch, dtype):
    """Same rows forward, same [V, D] gradient (float32, as the table) back, with blocks that
    do not divide the 21 tokens; the bfloat16 cotangent is summed in float32 by both."""
    monkeypatch.setattr(embedding, 'GRAD_BLOCK_TOKENS', 4)
    table, tokens, cotangent = _table_tokens_cotangent()
    np.testing.assert_array_equal(
        embedding.scatter_free_lookup(table, tokens, dtype),
        embedding.take_lookup(table, tokens, dtype),
    )
    assert embedding.take_lookup(table, tokens, dtype).dtype == dtype
    want = _gradient(embedding.take_lookup, table, tokens, cotangent, dtype)
    got = _gradient(embedding.scatter_free_lookup, table, tokens, cotangent, dtype)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    manual = np.zeros((V, D), np.float32)
    np.add.at(manual, np.asarray(tokens), np.float32(np.asarray(cotangent).astype(dtype)))
    np.testing.assert_allclose(got, manual, rtol=1e-5, atol=1e-5)
    assert np.abs(manual[:6]).min() > 0 and not manual[6:].any()


def test_scatter_free_gradient_compiles_without_scatter():
    """XLA's program for the gather's gradient holds a scatter; the one-hot product's none."""
    table, tokens, cotangent = _table_tokens_cotangent()

    def scatters(lookup) -> list[str]:
        def loss(t, k, c):
            return (lookup(t, k, jnp.float32) * c).sum()

        text = jax.jit(jax.grad(loss)).lower(table, tokens, cotangent).compile().as_text()
        return re.findall(r'\sscatter\(', text)  # the op, not a name in the metadata

    assert scatters(embedding.take_lookup)
    assert not scatters(embedding.scatter_free_lookup)


def test_gpu_takes_the_scatter_free_gradient_and_cpu_the_scatter(monkeypatch):
    for backend, scatter_free in (('cpu', False), ('tpu', False), ('gpu', True)):
        monkeypatch.setattr(platform.jax, 'default_backend', lambda b=backend: b)
        assert platform.scatter_free_embedding_grad() is scatter_free, backend


def test_transformer_gradients_equal_with_either_lookup(monkeypatch):
    """The whole model's gradients, with the scatter-free lookup forced on this CPU, equal
    those of the scatter (the shared matrix adds source, target and projection uses), and its
    compiled gradient has no scatter left."""
    model = tiny_model()
    batch = packed_batch(3)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'], batch['targets'])
    params = fill_random(nn.unbox(shapes['params']), seed=4)
    weights = np.random.default_rng(5).standard_normal((*batch['targets'].shape, 32))

    def loss(p):
        return (model.apply({'params': p}, batch['inputs'], batch['targets']) * weights).sum()

    def compiled():
        return jax.jit(jax.grad(loss)).lower(params).compile()

    want = compiled()(params)
    monkeypatch.setattr(platform, 'scatter_free_embedding_grad', lambda: True)
    scatter_free = compiled()
    assert not re.findall(r'\sscatter\(', scatter_free.as_text())
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(scatter_free(params)),
        jax.tree_util.tree_leaves(want),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=str(path))
