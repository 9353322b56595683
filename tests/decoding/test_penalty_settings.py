"""One compiled beam search serves every length penalty setting: alpha and the rule are traced
values (transformer/decoding/beam.py), and the search decodes exactly as it did when both were
static arguments, one program per setting."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.decoding.test_decode import EIGHT_INPUTS, EXTRA, MODEL, random_params
from transformer import decoding
from transformer.decoding import beam, translation

SETTINGS = [(alpha, rule) for alpha in (0.6, 1.0, 1.4) for rule in ('gnmt', 'fairseq')]
SEARCH = dict(beam_size=4, options=decoding.DecodeOptions(extra_length=EXTRA), early_stop=True)
COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


def static_penalty(length, alpha: float, rule: str):
    """The length penalty as the search computed it when alpha and the rule were static
    arguments (main 9f56641, `next_token.length_penalty`): a Python branch on the rule and
    alpha a constant of the compiled program."""
    length = jnp.asarray(length, jnp.float32)
    if rule == 'gnmt':
        return ((5.0 + length) / 6.0) ** alpha
    return length**alpha


def static_search(params, inputs, alpha: float, rule: str, monkeypatch):
    """The search with the same body as `beam._beam_search`, compiled for one setting with
    `static_penalty` in place of the traced one: the program each setting compiled before."""
    with monkeypatch.context() as patch:
        patch.setattr(beam, 'penalty', lambda length, *_: static_penalty(length, alpha, rule))
        body = functools.partial(beam._beam_search.__wrapped__, MODEL, alpha=None, rule=None)
        return jax.jit(functools.partial(body, **SEARCH))(params, inputs)


# Best hypotheses (EOS = 1) and scores of EIGHT_INPUTS, beam 4, recorded from main 9f56641,
# where alpha and the rule were static arguments (one compiled search per setting). Each best
# score leads the second by at least 0.0066, far above float32 rounding on any platform.
RECORDED = {
    (0.6, 'gnmt'): (
        ['1', '5 1', '5 1', '1', '1', '1', '5 1', '1'],
        [-1.87415576, -3.82429600, -2.64793849, -1.99187410, -2.08250999, -2.30408335,
         -3.55656552, -2.21503305],
    ),
    (0.6, 'fairseq'): (
        ['5 1'] * 8,
        [-1.65321183, -2.76758885, -1.91627550, -1.72367334, -1.73081708, -1.81813836,
         -2.57383609, -1.79425681],
    ),
    (1.0, 'gnmt'): (
        ['1', '5 1', '5 1', '1', '1', '1', '5 1', '1'],
        [-1.87415576, -3.59561157, -2.48959756, -1.99187410, -2.08250999, -2.30408335,
         -3.34389091, -2.21503305],
    ),
    (1.0, 'fairseq'): (
        ['5 1', '4 4 4 4 1', '5 1', '5 1', '5 1', '5 1', '2 4 2 4 1', '5 1'],
        [-1.25290036, -1.83280718, -1.45226538, -1.30630016, -1.31171417, -1.37789138,
         -1.70723879, -1.35979247],
    ),
    (1.4, 'gnmt'): (
        ['1', '5 1', '5 1', '1', '1', '5 1', '5 1', '5 1'],
        [-1.87415576, -3.38060212, -2.34072518, -1.99187410, -2.08250999, -2.22085094,
         -3.14393377, -2.19167972],
    ),
    (1.4, 'fairseq'): (
        ['2 2 4 3 2 4 2 4 1', '4 4 4 4 1', '2 4 2 4 1', '2 2 4 4 3 2 4 1', '2 2 4 4 3 2 4 1',
         '2 4 3 2 4 1', '2 4 2 4 1', '2 2 4 3 2 4 2 4 1'],
        [-0.60794437, -0.96278381, -0.81829780, -0.63565040, -0.62848222, -0.74575156,
         -0.89682204, -0.59051871],
    ),
}  # fmt: skip


@pytest.fixture(scope='module')
def params():
    return random_params(sharpness=1.5, seed=5, eos_logit=0.5)


def test_every_setting_decodes_as_it_did_with_static_arguments(params):
    """3 alphas x 2 rules through the one traced program give, token for token, the best
    hypotheses the search gave at 9f56641 with one program per setting (`RECORDED`)."""
    for (alpha, rule), (best, scores) in RECORDED.items():
        sequences, found = decoding.beam_search(
            MODEL, params, EIGHT_INPUTS, beam_size=4,
            options=decoding.DecodeOptions(EXTRA, alpha=alpha, length_penalty=rule),
        )  # fmt: skip
        texts = [' '.join(str(t) for t in row[0] if t) for row in np.asarray(sequences)]
        assert texts == best, (alpha, rule)
        np.testing.assert_allclose(np.asarray(found)[:, 0], scores, rtol=1e-5)


# Each alpha and each rule in the suite; the other three pairs (long tier) run the same
# rules' code, each with an alpha another suite case compiles as a constant.
IN_THE_SUITE = [(0.6, 'gnmt'), (1.0, 'fairseq'), (1.4, 'gnmt')]


@pytest.mark.slow
@pytest.mark.parametrize(
    'alpha, rule',
    [
        setting if setting in IN_THE_SUITE else pytest.param(*setting, marks=pytest.mark.long)
        for setting in SETTINGS
    ],
)
def test_every_setting_gives_the_bits_of_its_own_compiled_search(params, monkeypatch, alpha, rule):
    """The 6 settings against `static_search`, compiled once per setting: the same sequences
    and number of steps, and on a CPU the same score bits (XLA's CPU pow gives a traced
    exponent the bits of a constant one; elsewhere the scores agree to 1e-6)."""
    new = beam._beam_search(
        MODEL, params, EIGHT_INPUTS, alpha=np.float32(alpha),
        rule=decoding.next_token.penalty_rule(rule), **SEARCH,
    )  # fmt: skip
    old = static_search(params, EIGHT_INPUTS, alpha, rule, monkeypatch)
    np.testing.assert_array_equal(np.asarray(new[0]), np.asarray(old[0]))
    if jax.default_backend() == 'cpu':
        np.testing.assert_array_equal(np.asarray(new[1]), np.asarray(old[1]))
    np.testing.assert_allclose(np.asarray(new[1]), np.asarray(old[1]), rtol=1e-6)
    assert int(new[2]) == int(old[2])


def test_new_alphas_and_the_other_rule_compile_nothing(params):
    """After the first decode (and n-best's rescoring), two more alphas and the other rule run
    the program already compiled: the search's jit cache keeps one entry and jax compiles no
    program at all (the decode, the rescoring and its eager operations included)."""
    compiled = []

    def count(event, duration, **kwargs):
        if event == COMPILE_EVENT:
            compiled.append(kwargs.get('fun_name', ''))

    def decode(alpha, rule):
        sequences, scores = decoding.beam_search(
            MODEL, params, EIGHT_INPUTS, beam_size=4,
            options=decoding.DecodeOptions(EXTRA, alpha=alpha, length_penalty=rule),
        )  # fmt: skip
        sequences, scores = np.asarray(sequences), np.asarray(scores)
        return translation.sequence_log_probs(sequences, scores, alpha, rule)

    decode(0.6, 'gnmt')
    entries = beam._beam_search._cache_size()
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        for alpha, rule in [(0.7, 'gnmt'), (1.2, 'gnmt'), (1.2, 'fairseq')]:  # none seen before
            decode(alpha, rule)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert compiled == []
    assert beam._beam_search._cache_size() == entries


def test_a_bad_rule_is_one_line_before_anything_compiles(params):
    with pytest.raises(ValueError, match=r"one of \('gnmt', 'fairseq'\), got 'wu'"):
        decoding.beam_search(
            MODEL, params, EIGHT_INPUTS, options=decoding.DecodeOptions(length_penalty='wu')
        )


@pytest.mark.parametrize('alpha', [-0.5, float('nan')])
def test_a_negative_alpha_is_one_line_before_anything_decodes(params, alpha):
    """Beam search's early stop assumes a penalty that grows with the length (alpha >= 0):
    the Python entry points refuse another alpha, as the config and the flags do."""
    entries = beam._beam_search._cache_size()
    with pytest.raises(ValueError, match=r'^alpha must be >= 0 .*, got (-0\.5|nan)\.$'):
        decoding.beam_search(
            MODEL, params, EIGHT_INPUTS, options=decoding.DecodeOptions(alpha=alpha)
        )
    with pytest.raises(ValueError, match=r'^alpha must be >= 0'):
        translation.translate_lines(
            ['a b'], None, MODEL, params, beam_size=1,
            options=decoding.DecodeOptions(2, alpha=alpha),
            batch_size=1, max_input_tokens=8,
        )  # fmt: skip
    assert beam._beam_search._cache_size() == entries
