"""Forced first tokens (`DecodeOptions.forced`: a target-language code, Hugging Face's
``forced_bos_token_id``) on the vocabulary of test_special_ids.py, whose decoder start (EOS, 2)
is not its pad (1): every output starts with them, its score counts their log-probabilities,
and a forced id the vocabulary never emits is still forced.

The forced pair here is (LANGUAGE_CODE, <s>): <s> is in never_emit and the model prefers it
by far at every step, so it appears at position 1 only because it is forced, and nowhere else.
"""

import numpy as np
import pytest

from tests.decoding.test_special_ids import (
    BOS,
    EOS,
    EXTRA,
    INPUTS,
    LANGUAGE_CODE,
    MODEL,
    NATIVE,
    PAD,
    _length,
    _padded,
    _params,
    _stepped_log_probs,
)
from transformer import decoding

FORCED = (LANGUAGE_CODE, BOS)
OPTIONS = decoding.DecodeOptions(EXTRA, forced=FORCED)


def test_greedy_outputs_start_with_the_forced_ids_then_take_the_argmax():
    outputs = np.asarray(decoding.greedy_search(MODEL, _params(), INPUTS, options=OPTIONS))
    steps = _stepped_log_probs(MODEL, INPUTS, outputs)
    allowed = steps.copy()
    allowed[..., list(NATIVE.never_emit)] = -np.inf
    assert (outputs[:, :2] == FORCED).all()
    # Unforced, the model would put <s> at position 1: it is there because it is forced.
    assert (np.argmax(steps[:, 0], -1) == BOS).all() and (np.argmax(steps[:, 1], -1) == BOS).all()
    for row, tokens in enumerate(outputs):
        n = _length(tokens)
        assert n >= 3 and tokens[n - 1] == EOS and (tokens[n:] == PAD).all()
        assert not np.isin(tokens[2:n], NATIVE.never_emit).any()
        limit = int((INPUTS[row] != PAD).sum()) + EXTRA  # the forced ids count in it
        for t in range(2, n if n < limit else n - 1):
            assert tokens[t] == np.argmax(allowed[row, t]), (row, t)


@pytest.mark.slow
def test_forced_ids_are_a_prefix_shared_by_every_row_before_its_own():
    """forced + a row's prefix == that row's prefix written out in full."""
    own = np.array([[5, PAD], [6, 7], [PAD, PAD]], np.int32)
    with_forced = decoding.DecodeOptions(EXTRA, forced=FORCED, prefixes=own)
    written = np.full((3, 4), PAD, np.int32)
    written[:, :2] = FORCED
    written[:, 2:] = own
    in_full = decoding.DecodeOptions(EXTRA, prefixes=written)
    greedy = np.asarray(decoding.greedy_search(MODEL, _params(), INPUTS, options=with_forced))
    np.testing.assert_array_equal(
        greedy, np.asarray(decoding.greedy_search(MODEL, _params(), INPUTS, options=in_full))
    )
    beams = decoding.beam_search(MODEL, _params(), INPUTS, beam_size=2, options=with_forced)
    written_beams = decoding.beam_search(MODEL, _params(), INPUTS, beam_size=2, options=in_full)
    for got, want in zip(beams, written_beams, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for best in (greedy, np.asarray(beams[0])[:, 0]):
        assert (best[:, :2] == FORCED).all()
        assert best[0, 2] == 5 and list(best[1, 2:4]) == [6, 7]


def test_beam_outputs_start_with_the_forced_ids_and_their_scores_count_them():
    """Each hypothesis' score is the stepped decoder's log-probability of all its tokens,
    the forced ones included, over GNMT's penalty of its length (which counts them too)."""
    sequences, scores = decoding.beam_search(MODEL, _params(), INPUTS, beam_size=3, options=OPTIONS)
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    assert np.isfinite(scores).all() and (sequences[:, :, :2] == FORCED).all()
    for k in range(3):
        steps = _stepped_log_probs(MODEL, INPUTS, sequences[:, k])
        for row, tokens in enumerate(sequences[:, k]):
            n = _length(tokens)
            assert not np.isin(tokens[2:n], NATIVE.never_emit).any()
            picked = steps[row, np.arange(n), tokens[:n]]
            want = picked.sum() / ((5 + n) / 6) ** 0.6
            np.testing.assert_allclose(scores[row, k], want, atol=1e-4)
            without = picked[2:].sum() / ((5 + n) / 6) ** 0.6
            assert abs(scores[row, k] - without) > 1e-2  # the forced ids' share is counted


@pytest.mark.parametrize(
    ('forced', 'extra', 'message'),
    [
        ((LANGUAGE_CODE, PAD), EXTRA, r'^forced ids \(11, 1\) hold the pad id 1 or the EOS id 2'),
        ((EOS,), EXTRA, r'^forced ids \(2,\) hold the pad id 1 or the EOS id 2'),
        (FORCED, 1, r'^2 forced ids leave no room for EOS within extra_length=1: raise'),
    ],
)
def test_forced_ids_that_cannot_be_forced_are_one_line_before_decoding(forced, extra, message):
    options = decoding.DecodeOptions(extra, forced=forced)
    for search in (decoding.greedy_search, decoding.beam_search, decoding.sample_search):
        with pytest.raises(ValueError, match=message):
            search(MODEL, _params(), INPUTS, options=options)


class _Numbers:
    """A vocabulary whose text is its ids written out, with the special ids above."""

    special = NATIVE

    def encode_batch(self, texts, side):
        return [[int(word) for word in text.split()] for text in texts]


@pytest.mark.slow
def test_a_scored_target_counts_the_forced_ids_as_a_teacher_forced_loss_does():
    """`score_pairs` with forced ids scores [forced, target, EOS]: their log-probabilities
    are the stepped decoder's, and the token count and score hold them."""
    options = decoding.DecodeOptions(EXTRA, alpha=1.0, length_penalty='fairseq', forced=FORCED)
    sources, targets = ['4 5 6', '7'], ['5 6', '8 9 10']
    scored = decoding.score_pairs(
        MODEL, _params(), _Numbers(), sources, targets, options=options, batch_size=4
    )
    labels = [[*FORCED, 5, 6, EOS], [*FORCED, 8, 9, 10, EOS]]
    # Both pairs (and INPUTS' third row, fed EOS) in the searches' shape: the stepped
    # decoder compiled for them; a step reads only the tokens fed before it.
    steps = _stepped_log_probs(MODEL, INPUTS, _padded([*labels, [EOS]]))
    for pair, row, tokens in zip(scored, range(2), labels, strict=True):
        want = steps[row, np.arange(len(tokens)), tokens]
        assert pair.tokens == len(tokens)
        np.testing.assert_allclose(pair.token_log_probs, want, atol=1e-4)
        np.testing.assert_allclose(pair.log_prob, want.sum(), atol=1e-4)
        np.testing.assert_allclose(pair.score, want.sum() / len(tokens), atol=1e-4)
    assert min(pair.token_log_probs[1] for pair in scored) > -1  # <s>: likely, never emitted
