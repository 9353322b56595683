"""Sampling (transformer/decoding/sampling.py): the drawn frequencies are the tempered model's,
top-k and top-p keep to their support, top-k 1 is greedy, and a sentence's samples depend on
the seed and its line index only (not on its batch, its row or the device).

Chi-square tests run at the 0.001 level on fixed seeds: a correct sampler fails one in 1000
seeds (seed 3 of the prefix test is one: p = 0.00097 at T = 0.7, while `draw` on that
distribution gave p-values over seeds 0-19 that a Kolmogorov-Smirnov test finds uniform, p =
0.56); a sampler that ignored the temperature or the filters would give p-values below 1e-10
with these draw counts.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from tests.decoding.test_decode import EIGHT_INPUTS, MODEL, random_params, teacher_forced_log_probs
from transformer import decoding
from transformer.decoding import sampling as sampling_lib
from transformer.decoding.sampling import Sampling
from transformer.model import EOS_ID, PAD_ID

LEVEL = 1e-3
EXTRA = 3
LINES = np.arange(100, 108, dtype=np.int32)  # EIGHT_INPUTS' line indices


def sample(params, settings: Sampling, inputs=EIGHT_INPUTS, lines=LINES) -> tuple:
    """(tokens [8, T], log_probs [8]) of one sample each; every call passes the same
    arguments, so that all settings run one compiled search."""
    tokens, log_probs = decoding.sample_search(
        MODEL,
        params,
        inputs,
        sampling=settings,
        line_indices=lines,
        options=decoding.DecodeOptions(extra_length=EXTRA),
    )
    return np.asarray(tokens)[:, 0], np.asarray(log_probs)[:, 0]


@pytest.fixture(scope='module')
def params():
    return random_params(sharpness=1.5, seed=5, eos_logit=0.5)


def _draw(log_probs: np.ndarray, settings: Sampling, rows: int) -> np.ndarray:
    """``rows`` tokens drawn from one row of log-probs, each with its own line's key."""
    keys = sampling_lib.sentence_keys(
        jnp.int32(settings.seed), jnp.arange(rows), jnp.zeros(rows, jnp.int32), jnp.int32(0)
    )
    tiled = jnp.tile(jnp.asarray(log_probs, jnp.float32)[None], (rows, 1))
    return np.asarray(jax.jit(sampling_lib.draw)(tiled, settings, keys))


def _chi_square_p(tokens: np.ndarray, probs: np.ndarray) -> float:
    probs = np.asarray(probs, np.float64)
    support = probs > 0
    counts = np.bincount(tokens, minlength=len(probs))
    assert counts[~support].sum() == 0, 'a token outside the support was drawn'
    expected = probs[support] / probs[support].sum() * len(tokens)
    return stats.chisquare(counts[support], expected).pvalue


@pytest.mark.slow
def test_one_step_from_a_prefix_draws_the_tempered_model_distribution(params):
    """4000 samples of one input whose first two output tokens are forced: the token drawn
    at position 2 follows softmax(log P / T) of the teacher-forced model there (pad excluded,
    as it can never be output), for T = 0.7 and 1.5."""
    inputs = EIGHT_INPUTS[:1]
    prefix = np.array([[4, 2]], np.int32)
    log_probs = teacher_forced_log_probs(params, inputs, np.array([[4, 2, 3]], np.int32))[0, 2]
    log_probs[PAD_ID] = -np.inf
    for temperature in (0.7, 1.5):
        tokens, _ = decoding.sample_search(
            MODEL, params, inputs,
            options=decoding.DecodeOptions(max_decode_len=4, extra_length=EXTRA, prefixes=prefix),
            sampling=Sampling(temperature=temperature, seed=4, num_samples=4000),
            min_stage_batch=4000,  # one loop, no shrinking stages to compile
        )  # fmt: skip
        tokens = np.asarray(tokens)[0]
        assert np.all(tokens[:, :2] == prefix)
        probs = np.asarray(jax.nn.softmax(log_probs / temperature))
        assert _chi_square_p(tokens[:, 2], probs) > LEVEL, temperature


def test_top_k_and_top_p_keep_to_their_support_and_its_renormalised_distribution():
    """Drawn tokens lie in the k best (top-k) and in the nucleus (top-p, computed here in
    numpy: the best tokens until their mass reaches p), with the renormalised frequencies."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(12).astype(np.float32) * 1.5
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    order = np.argsort(-log_probs, kind='stable')
    probs = np.exp(log_probs)
    for settings in (
        Sampling(top_k=3, seed=1),
        Sampling(top_p=0.6, seed=2),
        Sampling(top_k=5, top_p=0.8, temperature=0.8, seed=4),
    ):
        tempered = np.asarray(jax.nn.softmax(log_probs / settings.temperature))
        keep = np.zeros(12, bool)
        k = settings.top_k or 12
        kept_mass = tempered[order[:k]] / tempered[order[:k]].sum()
        before = np.cumsum(kept_mass) - kept_mass
        keep[order[:k][before < settings.top_p]] = True
        assert 0 < keep.sum() < 12
        tokens = _draw(log_probs, settings, 3000)
        assert set(np.unique(tokens)) <= set(np.flatnonzero(keep)), settings
        assert _chi_square_p(tokens, np.where(keep, tempered, 0.0)) > LEVEL, settings
    assert np.all(probs > 0.001)  # every token would be drawn without the filters


def test_top_k_one_is_greedy(params):
    greedy = decoding.greedy_search(
        MODEL, params, EIGHT_INPUTS, options=decoding.DecodeOptions(extra_length=EXTRA)
    )
    for seed, temperature in ((0, 1.0), (7, 2.5)):
        tokens, _ = sample(params, Sampling(top_k=1, temperature=temperature, seed=seed))
        np.testing.assert_array_equal(tokens, np.asarray(greedy))


def test_log_probs_are_the_models_and_samples_end_well(params):
    """Each sample's log-prob is the teacher-forced model's log P(y|x), EOS included."""
    from tests.decoding.test_decode import _full_forward, assert_well_formed

    tokens, log_probs = sample(params, Sampling(temperature=1.3, seed=11))
    assert_well_formed(tokens)
    assert np.all((tokens == EOS_ID).sum(-1) == 1)
    forward = np.asarray(_full_forward(params, EIGHT_INPUTS, tokens))
    picked = np.take_along_axis(forward, tokens[..., None], axis=-1)[..., 0]
    expected = np.where(tokens != PAD_ID, picked, 0.0).sum(-1)
    np.testing.assert_allclose(log_probs, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_samples_depend_on_the_seed_and_line_only(params):
    """The same seed and line indices give each sentence the same samples in another batch
    order and with the batch split over 8 CPU devices; another seed gives other samples."""
    settings = Sampling(temperature=1.5, seed=21)
    base, _ = sample(params, settings)
    assert len({tuple(row) for row in base}) > 4  # not all alike
    order = np.random.default_rng(1).permutation(8)
    np.testing.assert_array_equal(
        sample(params, settings, EIGHT_INPUTS[order], LINES[order])[0], base[order]
    )
    other, _ = sample(params, Sampling(temperature=1.5, seed=22))
    assert np.sum(np.any(other != base, axis=-1)) >= 4
    devices = jax.devices('cpu')
    assert len(devices) == 8
    rows = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devices), ('data',)), jax.sharding.PartitionSpec('data')
    )
    sharded, _ = sample(
        params, settings, jax.device_put(EIGHT_INPUTS, rows), jax.device_put(LINES, rows)
    )
    np.testing.assert_array_equal(sharded, base)


@pytest.mark.parametrize(
    'settings, message',
    [
        (Sampling(temperature=0.0), 'temperature must be > 0, got 0.0'),
        (Sampling(temperature=-1.0), 'temperature must be > 0'),
        (Sampling(top_p=0.0), r'top_p must be in \(0, 1\], got 0.0'),
        (Sampling(top_p=1.5), r'top_p must be in \(0, 1\]'),
        (Sampling(top_k=-1), 'top_k must be >= 1'),
        (Sampling(num_samples=0), 'num_samples must be >= 1, got 0'),
        (Sampling(seed=-3), 'seed must be a whole number'),
    ],
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(ValueError, match=message) as info:
        settings.check()
    assert '\n' not in str(info.value)
