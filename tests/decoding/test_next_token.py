"""Tests of transformer/decoding/next_token.py's top-k (the searches' results:
tests/decoding/test_decode.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding.next_token import top_k


@pytest.mark.parametrize('width', [4 * 8000, 5 * 999 + 7])
@pytest.mark.parametrize('k', [1, 4, 5])
def test_top_k_equals_lax_top_k_with_ties_and_minus_inf(width, k):
    """Same values and indices as jax.lax.top_k, ties included (to the lower index), on
    widths that do and do not fill whole blocks, with forbidden (-inf) entries."""
    rng = np.random.default_rng(width + k)
    rows = [
        rng.standard_normal(width),
        rng.integers(0, 3, width).astype(np.float64),  # thousands of ties
        np.where(rng.random(width) < 0.999, -np.inf, rng.standard_normal(width)),
        np.full(width, -np.inf),  # nothing allowed: the k lowest indices, as lax's
        # k - 1 large entries in late blocks, then a tie of 0s: the k-th is index 0, in the
        # block with the smallest maximum among those chosen.
        np.zeros(width),
    ]
    for j in range(k - 1):
        rows[-1][width - 1 - 300 * j] = 10.0 + j
    x = jnp.asarray(np.stack(rows).astype(np.float32))
    # Blocks of 128: both widths are past 2 * k * 128, so the blocked path is what is compared.
    values, indices = jax.jit(top_k, static_argnums=(1, 2))(x, k, 128)
    expected_values, expected_indices = jax.lax.top_k(x, k)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected_indices))


def test_top_k_of_narrow_rows_is_lax_top_k():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32))
    for got, want in zip(top_k(x, 4), jax.lax.top_k(x, 4), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
