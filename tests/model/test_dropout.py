"""16-bit-mask dropout: its drop rate, scaling, determinism and shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model import dropout


def _apply(rate, x, seed=0, deterministic=False):
    module = dropout.Dropout(rate)
    rngs = {'dropout': jax.random.key(seed)}
    return module.apply({}, x, deterministic=deterministic, rngs=rngs)


@pytest.mark.parametrize('rate', [0.1, 0.3, 0.5])
def test_drop_fraction_and_mean_match_the_rate(rate):
    x = jnp.ones((64, 128, 130))  # 1,064,960 elements; the last axis is not a power of 2
    y = np.asarray(_apply(rate, x))
    dropped = np.mean(y == 0)
    sigma = np.sqrt(rate * (1 - rate) / y.size)
    assert abs(dropped - rate) < 5 * sigma, (dropped, rate)
    threshold = dropout.drop_threshold(rate)
    kept = y[y != 0]
    np.testing.assert_allclose(kept, 65536 / (65536 - threshold), rtol=1e-7)
    assert abs(y.mean() - 1.0) < 5 * sigma / (1 - rate)  # inverted dropout keeps E[y] = x


@pytest.mark.slow
def test_kept_values_are_scaled_inputs_and_dropped_are_zero():
    x = jax.random.normal(jax.random.key(3), (4, 7, 9))  # odd last axis: a half-used draw
    y = np.asarray(_apply(0.3, x))
    assert y.shape == x.shape and 0.15 < np.mean(y == 0) < 0.45
    scale = 65536 / (65536 - dropout.drop_threshold(0.3))
    np.testing.assert_allclose(y[y != 0], np.asarray(x)[y != 0] * scale, rtol=1e-6)


def test_mask_is_a_function_of_the_key():
    a = dropout.keep_mask(jax.random.key(1), (8, 33), 0.1)
    b = dropout.keep_mask(jax.random.key(1), (8, 33), 0.1)
    c = dropout.keep_mask(jax.random.key(2), (8, 33), 0.1)
    assert bool(jnp.all(a == b)) and not bool(jnp.all(a == c))
    np.testing.assert_array_equal(
        _apply(0.2, jnp.ones((5, 6)), seed=4), _apply(0.2, jnp.ones((5, 6)), seed=4)
    )


def test_both_halves_of_a_draw_are_used_independently():
    """Neighbouring elements share one uint32; their decisions must not be correlated."""
    mask = np.asarray(dropout.keep_mask(jax.random.key(5), (4096, 256), 0.5))
    even, odd = mask[:, 0::2].ravel(), mask[:, 1::2].ravel()
    agreement = np.mean(even == odd)
    assert abs(agreement - 0.5) < 5 * np.sqrt(0.25 / even.size), agreement


@pytest.mark.parametrize('rate, deterministic', [(0.0, False), (0.3, True), (1e-6, False)])
def test_identity_when_off(rate, deterministic):
    x = jax.random.normal(jax.random.key(0), (3, 5))
    np.testing.assert_array_equal(_apply(rate, x, deterministic=deterministic), x)


def test_dtype_is_kept():
    y = _apply(0.1, jnp.ones((4, 8), jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    assert dropout.drop_threshold(0.1) == 6554 and dropout.drop_threshold(0.3) == 19661


def test_bfloat16_kept_values_are_scaled_in_float32():
    """Each kept bfloat16 value is its float32 product with the exact scale, rounded once: no
    bias from a bfloat16 scale (rate 0.1: 1.109375 for 1.1111, 0.998x on every value)."""
    x = jax.random.normal(jax.random.key(7), (256, 512)).astype(jnp.bfloat16)
    y = np.asarray(_apply(0.1, x).astype(jnp.float32))
    scale = 65536 / (65536 - dropout.drop_threshold(0.1))
    kept = y != 0
    want = (np.asarray(x.astype(jnp.float32)) * np.float32(scale)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(y[kept], want[kept].astype(np.float32))
    ratio = y[kept] / np.asarray(x.astype(jnp.float32))[kept]
    assert abs(ratio.mean() / scale - 1) < 2e-4, ratio.mean() / scale


def test_token_dropout_drops_whole_tokens_in_training_only():
    """model.token_dropout_rate: each token's embedding is kept whole (scaled by 1 / keep) or
    zeroed whole, at about the rate, before the positions are added; evaluation embeds every
    token."""
    from tests.random_params import fill_random
    from tests.tiny_run import tiny_model
    from transformer.model import abstract_params

    model = tiny_model(token_dropout_rate=0.3)  # dropout_rate 0: the sum is not dropped
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 32, (16, 64)))
    positions = jnp.broadcast_to(jnp.arange(64), tokens.shape)

    def embed(m, deterministic):
        return m._embed('encoder', tokens, positions, tokens != 0, deterministic)

    # Random values on the real tree: what holds for any table, without compiling the
    # initialisers op by op.
    variables = {'params': fill_random(abstract_params(model), 1)}
    table = variables['params']['shared_embedding']['embedding']
    rows = np.asarray(table[tokens] * np.sqrt(32))
    evaluated = np.asarray(model.apply(variables, True, method=embed))
    trained = np.asarray(
        model.apply(variables, False, method=embed, rngs={'dropout': jax.random.key(2)})
    )
    at_positions = evaluated - rows  # evaluation keeps every token
    got = trained - at_positions
    zero = np.all(np.abs(got) < 1e-6, axis=-1)
    assert abs(zero.mean() - 0.3) < 0.05
    scale = 65536 / (65536 - dropout.drop_threshold(0.3))
    np.testing.assert_allclose(got[~zero], rows[~zero] * scale, rtol=1e-5, atol=1e-5)
