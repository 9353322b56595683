"""Minimum length, n-gram blocking and forced prefixes (transformer/decoding/constraints.py) in
beam search, greedy search and sampling, and one compiled program for every new value of a
search setting.

Each search runs with the same argument structure throughout (constraints and prefixes
always given; Constraints(0, 0) and an all-zero prefix are "off"), so that each compiles once
for the whole module.
"""

import numpy as np
import pytest

from tests.compiles import compiled_programs
from tests.decoding.test_decode import (
    EIGHT_INPUTS,
    MODEL,
    _full_forward,
    assert_well_formed,
    output_lengths,
    random_params,
)
from transformer import decoding
from transformer.decoding import beam, greedy, sampling
from transformer.model import EOS_ID, PAD_ID

EXTRA = 3
T = EIGHT_INPUTS.shape[1] + EXTRA  # the loop length, 9
LIMITS = (EIGHT_INPUTS != PAD_ID).sum(-1) + EXTRA
NO_PREFIX = np.zeros((8, T), np.int32)
OFF = decoding.Constraints(0, 0)


@pytest.fixture(scope='module')
def params():
    # EOS likely early, and a random model repeats itself: both constraints have work to do.
    return random_params(sharpness=2.0, seed=3, eos_logit=1.5)


def search(name, params, constraints=OFF, prefixes=NO_PREFIX, settings=None):
    """[8, T] outputs (beam: the best; sampling: the one sample) of EIGHT_INPUTS."""
    options = decoding.DecodeOptions(extra_length=EXTRA, prefixes=prefixes)
    common = dict(options=options, constraints=constraints)
    if name == 'greedy':
        return np.asarray(decoding.greedy_search(MODEL, params, EIGHT_INPUTS, **common))
    if name == 'beam':
        sequences, _ = decoding.beam_search(MODEL, params, EIGHT_INPUTS, beam_size=3, **common)
        return np.asarray(sequences)[:, 0]
    settings = settings or decoding.Sampling(temperature=1.0, seed=2)
    tokens, _ = decoding.sample_search(
        MODEL, params, EIGHT_INPUTS, sampling=settings, line_indices=np.arange(8), **common
    )
    return np.asarray(tokens)[:, 0]


def repeats(row: np.ndarray, n: int) -> bool:
    tokens = row[: output_lengths(row)].tolist()
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize('name', ['greedy', 'beam', 'sample'])
def test_min_length_and_ngram_blocking_hold_where_the_model_breaks_them(name, params):
    """Unconstrained, some outputs end before 4 tokens and some repeat a bigram; with
    min_length 4 (capped by each output limit) and no_repeat_ngram 2, none does."""
    free = search(name, params)
    content = output_lengths(free) - 1  # tokens before EOS
    assert np.any(content < 4)
    assert any(repeats(row, 2) for row in free)
    bound = search(name, params, decoding.Constraints(min_length=4, no_repeat_ngram=2))
    assert_well_formed(bound)
    assert np.all(output_lengths(bound) - 1 >= np.minimum(4, LIMITS - 1))
    assert not any(repeats(row, 2) for row in bound)
    assert np.all((bound == EOS_ID).sum(-1) == 1)


def _prefixes() -> np.ndarray:
    forced = NO_PREFIX.copy()
    for row, prefix in enumerate([[2], [], [3, 3], [4, 2, 5], [5], [2, 2], [], [4, 4, 4]]):
        forced[row, : len(prefix)] = prefix
    return forced


@pytest.mark.parametrize('name', ['greedy', 'beam', 'sample'])
def test_outputs_start_with_their_prefix(name, params):
    forced = _prefixes()
    out = search(name, params, prefixes=forced)
    assert_well_formed(out)
    np.testing.assert_array_equal(np.where(forced != PAD_ID, out, 0), forced)


def test_greedy_continues_a_prefix_as_teacher_forcing_argmax_chain(params):
    """After the prefix, each token is the argmax of the full (uncached) forward pass over
    the prefix and the tokens chosen so far (pad never, EOS only at the limit)."""
    forced = _prefixes()
    out = search('greedy', params, prefixes=forced)
    chain = np.where(forced != PAD_ID, forced, 2)  # a non-pad filler after the prefix
    done = np.zeros(8, bool)
    for t in range(T):
        log_probs = np.array(_full_forward(params, EIGHT_INPUTS, chain))[:, t]
        log_probs[:, PAD_ID] = -np.inf
        log_probs[t + 1 >= LIMITS, 2:] = -np.inf
        chosen = np.where(forced[:, t] != PAD_ID, forced[:, t], log_probs.argmax(-1))
        chain[:, t] = np.where(done, PAD_ID, chosen)
        done |= chain[:, t] == EOS_ID
    np.testing.assert_array_equal(out, chain)


def test_new_settings_and_prefixes_compile_nothing(params):
    """After one decode each, new values of the temperature, top-k, top-p, seed, minimum
    length, n-gram size and prefix contents run the programs already compiled: the searches'
    jit caches keep their entries and jax compiles no program at all."""
    search('greedy', params)
    search('beam', params)
    search('sample', params)
    entries = [
        f._cache_size() for f in (greedy._greedy_search, beam._beam_search, sampling._sample_search)
    ]
    with compiled_programs() as compiled:
        for name in ('greedy', 'beam', 'sample'):
            search(name, params, decoding.Constraints(3, 2), _prefixes())
            search(name, params, decoding.Constraints(5, 4), np.roll(_prefixes(), 1, axis=0))
        for settings in (
            decoding.Sampling(temperature=0.5, top_k=2, top_p=0.7, seed=9),
            decoding.Sampling(temperature=2.0, top_k=0, top_p=0.95, seed=10),
        ):
            search('sample', params, settings=settings)
    assert compiled == []
    assert entries == [
        f._cache_size() for f in (greedy._greedy_search, beam._beam_search, sampling._sample_search)
    ]


def test_beam_scores_count_the_prefix_tokens_log_probs(params):
    """A prefixed hypothesis' beam score is the full teacher-forced log P(y|x), prefix
    included, over the length penalty."""
    sequences, scores = decoding.beam_search(
        MODEL, params, EIGHT_INPUTS, beam_size=3, constraints=OFF,
        options=decoding.DecodeOptions(extra_length=EXTRA, prefixes=_prefixes()),
    )  # fmt: skip
    best, scores = np.asarray(sequences)[:, 0], np.asarray(scores)[:, 0]
    forward = np.asarray(_full_forward(params, EIGHT_INPUTS, best))
    picked = np.take_along_axis(forward, best[..., None], axis=-1)[..., 0]
    log_probs = np.where(best != PAD_ID, picked, 0.0).sum(-1)
    penalty = ((5.0 + output_lengths(best)) / 6.0) ** 0.6
    np.testing.assert_allclose(scores, log_probs / penalty, rtol=1e-5, atol=1e-5)
