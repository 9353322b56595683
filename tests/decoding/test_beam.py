"""Beam search internals: early stopping, the cache its rows share (results: test_decode.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.decoding.test_decode import EIGHT_INPUTS, EXTRA, INPUTS, MODEL, random_params
from transformer.decoding import DecodeOptions, beam, next_token
from transformer.model.attention import MultiHeadAttention
from transformer.model.cache import beam_mask, share_across_beams


@pytest.mark.slow
def test_early_stop_gives_the_same_result_in_fewer_steps():
    """Stopping once no alive beam can beat the K finished ones changes nothing but the steps."""
    params = random_params(sharpness=2.0, seed=0, eos_logit=2.0)
    kwargs = dict(beam_size=4, alpha=0.6, rule=0, options=DecodeOptions(extra_length=EXTRA))
    early = beam._beam_search(MODEL, params, INPUTS, early_stop=True, **kwargs)
    full = beam._beam_search(MODEL, params, INPUTS, early_stop=False, **kwargs)
    assert int(full[2]) == 7 and int(early[2]) == 5
    np.testing.assert_array_equal(np.asarray(early[0]), np.asarray(full[0]))
    np.testing.assert_array_equal(np.asarray(early[1]), np.asarray(full[1]))


@pytest.mark.slow
def test_a_batch_that_shrinks_as_its_examples_finish_gives_the_same_result(cpu_choices):
    """With early stopping the search goes on with half, then a quarter of the examples once
    the others are done (a CPU's choice): the same sequences and scores as the full-length
    search."""
    inputs = EIGHT_INPUTS
    params = random_params(sharpness=2.0, seed=0, eos_logit=2.0)
    kwargs = dict(beam_size=4, alpha=0.6, rule=0, options=DecodeOptions(extra_length=EXTRA))
    assert next_token.stage_sizes(8, 2) == [8, 4, 2]
    alone = [
        int(beam._beam_search(MODEL, params, x[None], early_stop=True, **kwargs)[2]) for x in inputs
    ]
    # Examples finish at different steps, so every stage runs: 8 rows until step 4, 4 until
    # step 5, then the last 2 to step 9.
    assert alone == [9, 3, 5, 4, 4, 4, 4, 7]
    staged = beam._beam_search(MODEL, params, inputs, early_stop=True, min_stage_batch=2, **kwargs)
    full = beam._beam_search(MODEL, params, inputs, early_stop=False, **kwargs)
    assert int(staged[2]) == 9 and int(full[2]) == 9
    np.testing.assert_array_equal(np.asarray(staged[0]), np.asarray(full[0]))
    np.testing.assert_allclose(np.asarray(staged[1]), np.asarray(full[1]), rtol=1e-6)


def test_shared_cache_widens_the_self_attention_keys_and_keeps_the_rest():
    """K/V caches [B, N, T', H] -> zeros [B, N, T' * K, H]; encoder keys/values (shaped alike,
    told apart by name) and scalars stay; an entry it does not know is an error."""
    rng = np.random.default_rng(0)
    cache = {
        'layer': {
            'cached_key': rng.standard_normal((2, 2, 8, 3)).astype(np.float32),
            'cached_value': rng.standard_normal((2, 2, 8, 3)).astype(np.float32),
            'cache_index': np.int32(0),
        },
        'cross': {
            'cached_static_key': rng.standard_normal((2, 2, 8, 3)).astype(np.float32),
            'cached_static_value': rng.standard_normal((2, 2, 8, 3)).astype(np.float32),
        },
        'position': np.int32(0),
    }
    out = share_across_beams(cache, 3)
    for name in ('cached_key', 'cached_value'):
        assert out['layer'][name].shape == (2, 2, 24, 3)
        assert not np.any(np.asarray(out['layer'][name]))
    for name, x in cache['cross'].items():
        np.testing.assert_array_equal(out['cross'][name], x)
    assert int(out['layer']['cache_index']) == 0 and int(out['position']) == 0
    with pytest.raises(ValueError, match='other_rows'):
        share_across_beams(cache | {'other_rows': np.zeros((2, 5))}, 3)


@pytest.mark.slow
def test_rows_sharing_a_cache_attend_to_their_own_hypotheses():
    """Self-attention through the shared cache with a slot history equals attention over a
    cache of its own per row, gathered from the parent rows at every step."""
    batch, beams, length, d_model = 2, 3, 4, 8
    rows = batch * beams
    module = MultiHeadAttention(num_heads=2)
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((length, rows, 1, d_model)).astype(np.float32)
    params = module.init(jax.random.key(0), steps[0])['params']

    @functools.partial(jax.jit, static_argnames='cache_rows')
    def new_cache(cache_rows):
        x = jnp.zeros((cache_rows, length, d_model))
        return module.apply({'params': params}, x, decode=True, mutable=['cache'])[1]['cache']

    @jax.jit
    def step(cache, x, mask):
        y, variables = module.apply(
            {'params': params, 'cache': cache}, x, None, mask, decode=True, mutable=['cache']
        )
        return y, variables['cache']

    def gather(cache, parents):
        return jax.tree_util.tree_map(lambda x: x[parents] if x.ndim else x, cache)

    shared = share_across_beams(new_cache(batch), beams)
    own = new_cache(rows)
    history = np.zeros((rows, length), np.int32)
    for t in range(length):
        history[:, t] = np.arange(rows) % beams
        y_shared, shared = step(shared, steps[t], beam_mask(jnp.asarray(history), beams))
        y_own, own = step(own, steps[t], None)
        np.testing.assert_allclose(np.asarray(y_shared), np.asarray(y_own), atol=1e-5, rtol=1e-5)
        choice = rng.integers(0, beams, (batch, beams))
        parents = (np.arange(batch)[:, None] * beams + choice).ravel()
        history, own = history[parents], gather(own, parents)
    assert len(set(map(tuple, history))) > 1  # hypotheses did change parents
