"""Matrix products: float32 untouched, bfloat16 products on CPU with float32 results.

The CPU's branch is what these tests check, on any machine: the backend is named 'cpu' for
each of them (`on_a_cpu`); the last test checks that a GPU's is plain `jnp.einsum`.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer.backends import platform, products

EQUATIONS = {  # every product shape the model uses, with operand shapes
    'BTD,DNH->BTNH': ((2, 3, 8), (8, 2, 4)),
    'BTNH,NHD->BTD': ((2, 3, 2, 4), (2, 4, 8)),
    'BTD,VD->BTV': ((2, 3, 8), (11, 8)),
    'BTD,BTV->DV': ((2, 3, 8), (2, 3, 11)),
}


@pytest.fixture(autouse=True)
def on_a_cpu(monkeypatch):
    monkeypatch.setattr(platform.jax, 'default_backend', lambda: 'cpu')


def _operands(shapes, dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed))
    return tuple(jax.random.normal(k, s).astype(dtype) for k, s in zip(keys, shapes, strict=True))


def _dots(fn, *args):
    """(operand dtypes, preferred_element_type) of every dot_general in fn's jaxpr."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == 'dot_general':
                dtypes = tuple(str(v.aval.dtype) for v in eqn.invars)
                found.append((dtypes, str(eqn.params.get('preferred_element_type'))))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize('equation', sorted(EQUATIONS))
def test_float32_is_jnp_einsum(equation):
    a, b = _operands(EQUATIONS[equation], jnp.float32)
    np.testing.assert_array_equal(products.einsum(equation, a, b), jnp.einsum(equation, a, b))
    ga = jax.grad(lambda a, b: jnp.sum(products.einsum(equation, a, b) ** 2), (0, 1))(a, b)
    gb = jax.grad(lambda a, b: jnp.sum(jnp.einsum(equation, a, b) ** 2), (0, 1))(a, b)
    for x, y in zip(ga, gb, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize('equation', sorted(EQUATIONS))
def test_bfloat16_products_and_gradients_take_float32_results(equation):
    """Forward and both gradients: bfloat16 operands, float32 results (the fast CPU kernel),
    and the same numbers as the float32 products of the same bfloat16 values, rounded."""
    a, b = _operands(EQUATIONS[equation], jnp.bfloat16)
    w = jax.random.normal(jax.random.key(7), jnp.einsum(equation, a, b).shape)

    def loss(fn):
        return lambda a, b: jnp.sum(fn(equation, a, b).astype(jnp.float32) * w)

    def upcast(eq, a, b):
        return jnp.einsum(eq, a.astype(jnp.float32), b.astype(jnp.float32)).astype(jnp.bfloat16)

    y = products.einsum(equation, a, b)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(y), np.float32(upcast(equation, a, b)), rtol=1e-2)
    got = jax.grad(loss(products.einsum), (0, 1))(a, b)
    want = jax.grad(loss(upcast), (0, 1))(a, b)
    for x, ref in zip(got, want, strict=True):
        assert x.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.float32(x), np.float32(ref), rtol=2e-2, atol=2e-2)
    dots = _dots(jax.grad(loss(products.einsum), (0, 1)), a, b)
    assert len(dots) == 3  # forward, d(first), d(second)
    assert all(d == (('bfloat16', 'bfloat16'), 'float32') for d in dots), dots


def test_batched_products_stay_jnp_einsum():
    """The attention matrices (indices shared by both operands and the result) keep the plain
    bfloat16 product: XLA's CPU kernel for some of their layouts has no bf16 x bf16 -> f32."""
    a, b = _operands(((2, 3, 2, 4), (2, 5, 2, 4)), jnp.bfloat16)
    equation = 'BTNH,BSNH->BNTS'
    np.testing.assert_array_equal(products.einsum(equation, a, b), jnp.einsum(equation, a, b))
    assert _dots(lambda a, b: products.einsum(equation, a, b), a, b) == [
        (('bfloat16', 'bfloat16'), 'bfloat16')
    ]


def test_float16_keeps_jnp_einsum():
    """Only bfloat16 takes the float32-result path (float16 measured no faster with it)."""
    a, b = _operands(EQUATIONS['BTD,DNH->BTNH'], jnp.float16)
    fn = lambda a, b: products.einsum('BTD,DNH->BTNH', a, b)  # noqa: E731
    assert _dots(fn, a, b) == [(('float16', 'float16'), 'float16')]


def test_product_whose_gradient_is_not_an_einsum_is_refused():
    a, b = _operands(((3, 4), (4, 5)), jnp.bfloat16)
    with pytest.raises(ValueError, match='every index of the second operand'):
        products.einsum('ab,bc->a', a, b)  # c summed away in the second operand alone


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_dense_dot_general_equals_flax_dense(dtype):
    x = jax.random.normal(jax.random.key(0), (2, 3, 8)).astype(dtype)
    plain = nn.Dense(5, dtype=dtype)
    ours = nn.Dense(5, dtype=dtype, dot_general=products.dense_dot_general)
    params = plain.init(jax.random.key(1), x)
    want = plain.apply(params, x)
    got = ours.apply(params, x)
    assert got.dtype == want.dtype == dtype
    tol = 0 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tol, atol=tol)


def test_dense_dot_general_passes_on_the_precision():
    """A Dense layer's ``precision`` reaches the product of the einsum path (it was dropped)."""
    x = jnp.ones((2, 3, 8))
    ours = nn.Dense(5, precision=jax.lax.Precision.HIGHEST, dot_general=products.dense_dot_general)
    params = ours.init(jax.random.key(1), x)
    program = str(jax.make_jaxpr(ours.apply)(params, x))
    assert program.count('dot_general') == 1
    assert 'precision=(Precision.HIGHEST, Precision.HIGHEST)' in program


@pytest.mark.parametrize('equation', sorted(EQUATIONS))
def test_other_backends_take_plain_bfloat16_products(monkeypatch, equation):
    monkeypatch.setattr(platform.jax, 'default_backend', lambda: 'gpu')
    a, b = _operands(EQUATIONS[equation], jnp.bfloat16)
    np.testing.assert_array_equal(products.einsum(equation, a, b), jnp.einsum(equation, a, b))
    assert _dots(lambda a, b: products.einsum(equation, a, b), a, b) == [
        (('bfloat16', 'bfloat16'), 'bfloat16')
    ]
