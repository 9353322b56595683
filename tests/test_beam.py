"""Beam search internals: early stopping, cache reordering (results: tests/test_decode.py)."""

import jax
import numpy as np

from tests.test_decode import EXTRA, INPUTS, MODEL, random_params
from transformer import beam


def test_early_stop_gives_the_same_result_in_fewer_steps():
    """Stopping once no alive beam can beat the K finished ones changes nothing but the steps."""
    params = random_params(sharpness=2.0, seed=0, eos_logit=2.0)
    kwargs = dict(beam_size=4, alpha=0.6, max_decode_len=None, extra_length=EXTRA, ensemble=False)
    early = beam._beam_search(MODEL, params, INPUTS, early_stop=True, **kwargs)
    full = beam._beam_search(MODEL, params, INPUTS, early_stop=False, **kwargs)
    assert int(full[2]) == 7 and int(early[2]) == 5
    np.testing.assert_array_equal(np.asarray(early[0]), np.asarray(full[0]))
    np.testing.assert_array_equal(np.asarray(early[1]), np.asarray(full[1]))


def test_reorder_cache_gathers_the_written_positions():
    """K/V rows follow their parents at positions < written; other row arrays wholly; scalars
    and the encoder-decoder keys/values stay."""
    rng = np.random.default_rng(0)
    cache = {
        'layer': {
            'cached_key': rng.standard_normal((6, 2, 8, 3)).astype(np.float32),  # [R, N, T', H]
            'cached_value': rng.standard_normal((6, 2, 8, 3)).astype(np.float32),
            'cache_index': np.int32(5),
        },
        # Shaped like the self-attention caches: only the names tell them apart.
        'cross': {
            'cached_static_key': rng.standard_normal((6, 8, 2, 3)).astype(np.float32),
            'cached_static_value': rng.standard_normal((6, 8, 2, 3)).astype(np.float32),
        },
        'position': np.int32(5),
        'other_rows': rng.standard_normal((6, 5, 2, 3)).astype(np.float32),  # not [rows, 8, ..]
    }
    rows = np.array([1, 1, 0, 5, 3, 3], np.int32)
    reorder = jax.jit(beam._reorder_cache, static_argnames='length')
    for written in (1, 2, 5, 8):
        out = reorder(cache, rows, written, length=8)
        for name in ('cached_key', 'cached_value'):
            before, after = cache['layer'][name], np.asarray(out['layer'][name])
            np.testing.assert_array_equal(after[:, :, :written], before[rows, :, :written])
            # Written positions are gathered whole chunks at a time (chunk = 8 / 4 = 2).
            untouched = -(-written // 2) * 2
            np.testing.assert_array_equal(after[:, :, untouched:], before[:, :, untouched:])
        assert int(out['layer']['cache_index']) == 5 and int(out['position']) == 5
        for name, x in cache['cross'].items():
            np.testing.assert_array_equal(out['cross'][name], x)
        np.testing.assert_array_equal(out['other_rows'], cache['other_rows'][rows])
