"""transformer/backends/logits_layout.py: the tied logits' CPU gradient layout changes the work,
not the numbers; other backends take autodiff's gradient."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer.backends import logits_layout, platform


def _grads(fn, y, embedding, g):
    return jax.jit(jax.grad(lambda y, e: (fn(y, e) * g).sum(), argnums=(0, 1)))(y, embedding)


def test_cpu_gradient_equals_autodiff_and_other_backends_take_autodiff(monkeypatch):
    """The CPU's branch (the backend named 'cpu', whatever this machine is) has the custom
    gradient and gives autodiff's numbers; a GPU's has none."""
    monkeypatch.setattr(platform.jax, 'default_backend', lambda: 'cpu')
    rng = np.random.default_rng(0)
    y = rng.standard_normal((3, 5, 16)).astype(np.float32)
    embedding = rng.standard_normal((40, 16)).astype(np.float32)
    g = rng.standard_normal((3, 5, 40)).astype(np.float32)

    def plain(y, e):
        return jnp.einsum('BTD,VD->BTV', y, e)

    np.testing.assert_allclose(
        logits_layout.tied_logits(y, embedding), plain(y, embedding), rtol=1e-6
    )
    want = _grads(plain, y, embedding, g)
    got = _grads(logits_layout.tied_logits, y, embedding, g)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

    def has_custom_gradient() -> bool:  # a new function each time: traced anew
        program = jax.make_jaxpr(lambda a, b: logits_layout.tied_logits(a, b))(y, embedding)
        return 'custom_vjp' in str(program)

    assert has_custom_gradient()
    monkeypatch.setattr(platform.jax, 'default_backend', lambda: 'gpu')
    assert not has_custom_gradient()
