"""Tests of the searches (transformer/decoding/: greedy.py, beam.py, search.py) through the
package's public API: scores, exhaustive search, cache, padding, output limits.

A tiny model with random parameters (drawn in numpy on the real parameter tree, as in
tests/model/test_model.py) and 6 tokens: pad/start, EOS and 4 others. ``sharpness`` scales the
output projection, hence the logits, so that distributions are peaked like a trained model's;
``eos_logit`` makes stopping more or less likely. Shapes are shared between tests so that each
search compiles as few times as possible.
"""

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.random_params import fill_random
from transformer import decoding as decode
from transformer.model import EOS_ID, PAD_ID, Transformer, TransformerConfig

V = 6
MODEL = Transformer(
    TransformerConfig(
        vocab_size=V,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout_rate=0.0,
        # Untied output projection: with tied embeddings a random model mostly repeats the
        # token it was fed.
        share_embeddings='none',
        attention_impl='einsum',  # the same path on every backend
    )
)
# Right-padded sources of lengths 4, 2 and 3 (EOS included); the shared shape of most tests.
INPUTS = np.array([[2, 3, 4, 1], [5, 1, 0, 0], [4, 4, 1, 0]], np.int32)
EXTRA = 3  # output limits 7, 5, 6 = input length + EXTRA; loop length 4 + EXTRA = 7
OPTIONS = decode.DecodeOptions(extra_length=EXTRA)
# Eight sources of lengths 2-6, for the searches whose batch shrinks as examples finish.
EIGHT_INPUTS = np.array(
    [
        [4, 4, 3, 3, 2, 1],
        [2, 1, 0, 0, 0, 0],
        [5, 1, 0, 0, 0, 0],
        [5, 4, 4, 5, 1, 0],
        [4, 4, 4, 5, 1, 0],
        [5, 4, 1, 0, 0, 0],
        [3, 1, 0, 0, 0, 0],
        [4, 2, 5, 4, 5, 1],
    ],
    np.int32,
)


@functools.cache
def _param_shapes() -> dict:
    tokens = jnp.ones((1, 2), jnp.int32)
    return nn.unbox(jax.eval_shape(MODEL.init, jax.random.key(0), tokens, tokens)['params'])


def random_params(sharpness: float = 1.0, seed: int = 0, eos_logit: float = 0.0) -> dict:
    """Random values on the model's parameter tree; logits scale with ``sharpness``, and
    ``eos_logit`` is added to EOS's logit at every position (a random model has no sense of
    when to stop)."""
    params = fill_random(_param_shapes(), seed, logits_scale=sharpness)
    # Channel 0 of the last (post-LN) decoder output is pinned to 1, so row 0 of the output
    # projection becomes a per-token logit bias.
    last_norm = params['decoder_layer_0']['ffn_norm']
    last_norm['scale'][0], last_norm['bias'][0] = 0.0, 1.0
    kernel = params['logits_dense']['kernel']  # [D, V]
    kernel[0] = 0.0
    kernel[0, EOS_ID] = eos_logit
    return params


@jax.jit
def _full_forward(params, inputs, targets):
    return jax.nn.log_softmax(MODEL.apply({'params': params}, inputs, targets))


def teacher_forced_log_probs(params, inputs, targets) -> np.ndarray:
    """[B, T, V] log-probs of the full (uncached) forward pass.

    Every call runs on [512, 7] (extra rows and trailing columns padded): one compilation.
    """
    rows, width = targets.shape
    pad = ((0, 512 - rows), (0, 7 - width))
    padded = _full_forward(params, np.pad(inputs, pad[:1] + ((0, 0),)), np.pad(targets, pad))
    return np.array(padded)[:rows, :width]


def sequence_log_probs(params, inputs, targets) -> np.ndarray:
    """Teacher-forced log P(targets | inputs) [B], summed over the tokens through EOS."""
    log_probs = teacher_forced_log_probs(params, inputs, targets)
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return np.sum(np.where(targets != PAD_ID, picked, 0.0), axis=-1)


def output_lengths(tokens: np.ndarray) -> np.ndarray:
    """Tokens up to and including the first EOS (all of them when there is none)."""
    is_eos = tokens == EOS_ID
    return np.where(is_eos.any(-1), is_eos.argmax(-1) + 1, tokens.shape[-1])


def assert_well_formed(tokens: np.ndarray):
    """Content tokens, one EOS, then zeros."""
    lengths = output_lengths(tokens)
    positions = np.arange(tokens.shape[-1])
    inside = positions < lengths[..., None]
    assert np.all(tokens[~inside] == PAD_ID)
    assert np.all(tokens[inside] != PAD_ID)
    assert np.all((tokens == EOS_ID).sum(-1) <= 1)


@pytest.mark.slow
def test_scores_are_the_models_log_probs_over_the_length_penalty():
    """Every beam score == teacher-forced log-prob (EOS included) / ((5 + |y|) / 6)^0.6."""
    params = random_params(sharpness=2.0)
    sequences, scores = decode.beam_search(MODEL, params, INPUTS, options=OPTIONS)
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    assert sequences.shape == (3, 4, 7) and scores.shape == (3, 4)
    assert_well_formed(sequences)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    flat = sequences.reshape(12, 7)
    log_probs = sequence_log_probs(params, np.repeat(INPUTS, 4, axis=0), flat)
    expected = log_probs / ((5.0 + output_lengths(flat)) / 6.0) ** 0.6
    np.testing.assert_allclose(scores.reshape(-1), expected, rtol=1e-5, atol=1e-4)
    best = decode.translate_batch(MODEL, params, INPUTS, options=OPTIONS)
    np.testing.assert_array_equal(np.asarray(best), sequences[:, 0])


@pytest.mark.slow
def test_large_beam_equals_exhaustive_search():
    """With a beam as wide as every prefix, the K hypotheses are the K best of all sequences."""
    params = random_params(sharpness=1.5, seed=1)
    inputs = np.array([[2, 3, 1], [4, 1, 0]], np.int32)  # limits 3 + 2 = 5 and 2 + 2 = 4
    beam = (V - 2) ** 4  # every 4-token prefix stays alive: nothing is pruned
    sequences, scores = decode.beam_search(
        MODEL, params, inputs, beam_size=beam, options=decode.DecodeOptions(extra_length=2)
    )
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    # Every sequence the search may produce: content tokens, then EOS by the limit.
    candidates = {
        limit: np.array(
            [
                list(prefix) + [EOS_ID] + [PAD_ID] * (5 - n - 1)
                for n in range(limit)
                for prefix in itertools.product(range(2, V), repeat=n)
            ],
            np.int32,
        )
        for limit in (5, 4)
    }
    log_probs = sequence_log_probs(
        params,
        np.repeat(inputs, [len(candidates[5]), len(candidates[4])], axis=0),
        np.concatenate([candidates[5], candidates[4]]),
    )
    log_probs = {5: log_probs[: len(candidates[5])], 4: log_probs[len(candidates[5]) :]}
    for b, limit in enumerate([5, 4]):
        all_scores = log_probs[limit] / ((5.0 + output_lengths(candidates[limit])) / 6.0) ** 0.6
        best = np.argsort(-all_scores, kind='stable')[:beam]
        found = len(best)  # 256 of 341 for limit 5; all 85 for limit 4
        np.testing.assert_array_equal(sequences[b, :found], candidates[limit][best])
        np.testing.assert_allclose(scores[b, :found], all_scores[best], rtol=1e-5, atol=1e-4)
        assert np.all(scores[b, found:] == -np.inf)
        assert np.all(sequences[b, found:] == PAD_ID)


def greedy_by_recomputing(log_probs_of) -> np.ndarray:
    """Greedy decoding of INPUTS that re-runs ``log_probs_of(prefix)`` [3, 7, V] (the full
    teacher-forced forward pass) on the whole prefix at every step."""
    limits = (INPUTS != PAD_ID).sum(-1) + EXTRA
    # Positions not decoded yet hold a non-pad filler: causality hides them from the
    # positions that are read, and pad would mask the position being predicted.
    prefix = np.full((3, 7), 2, np.int32)
    done = np.zeros(3, bool)
    for t in range(7):
        log_probs = log_probs_of(prefix)[:, t]
        log_probs[:, PAD_ID] = -np.inf
        log_probs[t + 1 >= limits, 2:] = -np.inf
        prefix[:, t] = np.where(done, PAD_ID, log_probs.argmax(-1))
        done |= prefix[:, t] == EOS_ID
    return prefix


def test_cached_greedy_equals_recomputing_the_prefix():
    """Greedy over the KV cache == greedy re-running the full forward on the prefix each step."""
    params = random_params(sharpness=4.0, seed=4, eos_logit=2.0)
    tokens = np.asarray(decode.greedy_search(MODEL, params, INPUTS, options=OPTIONS))
    expected = greedy_by_recomputing(
        lambda prefix: teacher_forced_log_probs(params, INPUTS, prefix)
    )
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_array_equal(output_lengths(tokens), [1, 5, 6])  # EOS chosen, forced


def mixture_log_probs(members, inputs, targets) -> np.ndarray:
    """[B, T, V] log of the members' mean teacher-forced probabilities."""
    log_probs = np.stack([teacher_forced_log_probs(p, inputs, targets) for p in members])
    return np.logaddexp.reduce(log_probs, axis=0) - np.log(len(members))


@pytest.mark.slow
def test_ensemble_scores_are_the_mixtures_log_probs():
    """Beam search over two models scores every hypothesis by the teacher-forced
    log of the members' mean probability / length penalty; greedy takes that mixture's argmax
    at every step."""
    members = [random_params(sharpness=2.0, seed=2), random_params(sharpness=2.0, seed=3)]
    both = decode.ensemble_params(members)
    sequences, scores = decode.beam_search(MODEL, both, INPUTS, options=OPTIONS)
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    assert_well_formed(sequences)
    flat = sequences.reshape(12, 7)
    inputs = np.repeat(INPUTS, 4, axis=0)
    mixture = mixture_log_probs(members, inputs, flat)
    picked = np.take_along_axis(mixture, flat[..., None], axis=-1)[..., 0]
    log_probs = np.sum(np.where(flat != PAD_ID, picked, 0.0), axis=-1)
    expected = log_probs / ((5.0 + output_lengths(flat)) / 6.0) ** 0.6
    np.testing.assert_allclose(scores.reshape(-1), expected, rtol=1e-5, atol=1e-4)
    # Neither member alone gives these scores: the test tells the mixture from a member.
    for member in members:
        alone = (
            sequence_log_probs(member, inputs, flat) / ((5.0 + output_lengths(flat)) / 6.0) ** 0.6
        )
        assert np.max(np.abs(alone - expected)) > 0.05

    tokens = decode.greedy_search(MODEL, both, INPUTS, options=OPTIONS)
    expected_tokens = greedy_by_recomputing(
        lambda prefix: mixture_log_probs(members, INPUTS, prefix)
    )
    np.testing.assert_array_equal(np.asarray(tokens), expected_tokens)


def test_ensemble_of_copies_decodes_as_the_model():
    """Two copies of one model: the mean of two equal distributions is that distribution."""
    params = random_params(sharpness=2.0, seed=6)
    both = decode.ensemble_params([params, params])
    sequences, scores = decode.beam_search(MODEL, params, INPUTS, options=OPTIONS)
    copies = decode.beam_search(MODEL, both, INPUTS, options=OPTIONS)
    np.testing.assert_array_equal(np.asarray(copies[0]), np.asarray(sequences))
    np.testing.assert_allclose(np.asarray(copies[1]), np.asarray(scores), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        np.asarray(decode.translate_batch(MODEL, both, INPUTS, beam_size=1, options=OPTIONS)),
        np.asarray(decode.translate_batch(MODEL, params, INPUTS, beam_size=1, options=OPTIONS)),
    )


def _equations(jaxpr, in_loop: bool = False):
    """(inside a while loop?, equation) for every equation of ``jaxpr`` and of the jaxprs
    nested in it (jit, while, cond, ...)."""
    for eqn in jaxpr.eqns:
        yield in_loop, eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _equations(sub, in_loop or eqn.primitive.name == 'while')


def test_ensemble_members_run_the_single_models_step(cpu_choices):
    """Every member of an ensemble runs the single model's step: the self-attention's switch
    over cache chunks (a CPU's choice) stays one switch per member. Stacked and mapped with
    vmap, it became a select that runs every branch (the whole cache, every step)."""
    params = random_params()
    both = decode.ensemble_params([params, params])
    searches = {
        'greedy': lambda p: decode.greedy_search(MODEL, p, INPUTS, options=OPTIONS),
        'beam': lambda p: decode.beam_search(MODEL, p, INPUTS, options=OPTIONS),
    }
    for name, search in searches.items():
        alone = jax.make_jaxpr(search)(params)
        together = jax.make_jaxpr(search)(both)
        alone, together = (
            collections.Counter(eqn.primitive.name for _, eqn in _equations(jaxpr.jaxpr))
            for jaxpr in (alone, together)
        )
        assert alone['cond'] >= MODEL.config.num_decoder_layers, name
        assert together['cond'] == 2 * alone['cond'], name


@pytest.mark.slow
def test_beam_of_one_equals_greedy_on_confident_choices():
    """Beam 1 returns greedy's output when greedy is confident, and never scores below it."""

    def beam_one_and_greedy(params):
        greedy = np.asarray(decode.greedy_search(MODEL, params, INPUTS, options=OPTIONS))
        greedy_scores = sequence_log_probs(params, INPUTS, greedy) / np.asarray(
            decode.length_penalty(output_lengths(greedy), 0.6)
        )
        sequences, scores = decode.beam_search(MODEL, params, INPUTS, beam_size=1, options=OPTIONS)
        return greedy, greedy_scores, np.asarray(sequences)[:, 0], np.asarray(scores)[:, 0]

    # Peaked distributions whose greedy outputs end with a chosen EOS: the same output.
    params = random_params(sharpness=12.0, seed=8, eos_logit=6.0)
    greedy, greedy_scores, best, scores = beam_one_and_greedy(params)
    np.testing.assert_array_equal(output_lengths(greedy), [4, 2, 3])  # limits 7, 5, 6
    np.testing.assert_array_equal(best, greedy)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-5, atol=1e-4)
    translated = decode.translate_batch(MODEL, params, INPUTS, beam_size=1, options=OPTIONS)
    np.testing.assert_array_equal(np.asarray(translated), greedy)
    # Greedy never weighs stopping where EOS is not the top token; beam 1 scores every EOS on
    # its path. Here greedy runs into the forced EOS, and beam 1 stops early with more.
    params = random_params(sharpness=2.0, seed=3)
    greedy, greedy_scores, best, scores = beam_one_and_greedy(params)
    np.testing.assert_array_equal(output_lengths(greedy), [7, 5, 6])  # all forced
    np.testing.assert_array_equal(output_lengths(best), [2, 5, 2])
    np.testing.assert_array_equal(best[1], greedy[1])
    assert np.all(scores >= greedy_scores - 1e-5) and np.all(scores[[0, 2]] > greedy_scores[[0, 2]])


@pytest.mark.slow
def test_padding_does_not_change_the_output():
    """Adding pad columns (the first example had none) and a pad row changes no output."""
    params = random_params(sharpness=2.0, seed=4)
    greedy = np.asarray(decode.greedy_search(MODEL, params, INPUTS, options=OPTIONS))
    sequences, scores = decode.beam_search(MODEL, params, INPUTS, options=OPTIONS)
    padded = np.zeros((4, 6), np.int32)  # 2 more columns and an all-pad row
    padded[:3, :4] = INPUTS
    greedy_padded = np.asarray(decode.greedy_search(MODEL, params, padded, options=OPTIONS))
    sequences_padded, scores_padded = decode.beam_search(MODEL, params, padded, options=OPTIONS)
    # Limits follow the real lengths, not the width: the 2 extra columns stay empty.
    np.testing.assert_array_equal(greedy_padded[:3], np.pad(greedy, ((0, 0), (0, 2))))
    np.testing.assert_array_equal(
        np.asarray(sequences_padded)[:3], np.pad(np.asarray(sequences), ((0, 0), (0, 0), (0, 2)))
    )
    np.testing.assert_allclose(np.asarray(scores_padded)[:3], scores, rtol=1e-5, atol=1e-5)


def test_output_stops_at_input_length_plus_extra():
    """An example that never picks EOS gets it forced at input length + extra (or at T)."""
    params = random_params(sharpness=2.0, seed=5, eos_logit=-30.0)  # EOS never chosen
    limits = (INPUTS != PAD_ID).sum(-1) + EXTRA
    greedy = np.asarray(decode.greedy_search(MODEL, params, INPUTS, options=OPTIONS))
    assert_well_formed(greedy)
    np.testing.assert_array_equal(output_lengths(greedy), limits)
    np.testing.assert_array_equal(greedy[np.arange(3), limits - 1], EOS_ID)
    sequences, _ = decode.beam_search(MODEL, params, INPUTS, options=OPTIONS)
    sequences = np.asarray(sequences)
    assert_well_formed(sequences)
    lengths = output_lengths(sequences)
    assert np.all(lengths <= limits[:, None]) and np.all((lengths == limits[:, None]).any(-1))
    # A loop length below the limits caps every example at it.
    capped = np.asarray(
        decode.greedy_search(
            MODEL,
            params,
            INPUTS,
            options=decode.DecodeOptions(max_decode_len=4, extra_length=EXTRA),
        )
    )
    assert capped.shape == (3, 4)
    np.testing.assert_array_equal(capped[:, :3], greedy[:, :3])
    np.testing.assert_array_equal(capped[:, 3], EOS_ID)


def test_encoder_output_is_projected_before_the_decoding_loop_not_in_it():
    """No matrix product inside either search's loop reads the encoder output [B, S, D]:
    encoder-decoder attention projects it to keys and values once, before the loop (and
    before beam search repeats it for the K beams)."""
    params = random_params()
    d_model = MODEL.config.d_model
    searches = {
        (3, 4, d_model): lambda p: decode.greedy_search(MODEL, p, INPUTS, options=OPTIONS),
        'beam': lambda p: decode.beam_search(MODEL, p, INPUTS, options=OPTIONS),
    }
    for encoded_shape, search in searches.items():
        # Beam search projects each sentence's encoder output once, not once per beam.
        encoded_shape = (3, 4, d_model) if encoded_shape == 'beam' else encoded_shape
        jaxpr = jax.make_jaxpr(search)(params).jaxpr
        reads = [
            loop
            for loop, eqn in _equations(jaxpr)
            if eqn.primitive.name == 'dot_general'
            and encoded_shape in [v.aval.shape for v in eqn.invars]
        ]
        assert not any(reads), encoded_shape
        # Key and value of each decoder layer, one fused einsum (projections.fused_projections).
        assert len(reads) >= MODEL.config.num_decoder_layers, encoded_shape


@pytest.mark.slow
def test_greedy_batch_that_shrinks_as_examples_end_gives_the_same_output():
    """Once at most half of the examples are still without EOS, greedy goes on with half the
    rows, then a quarter: each example's output is the one it gets decoded alone."""
    params = random_params(sharpness=2.0, seed=0, eos_logit=-2.0)
    staged = np.asarray(
        decode.greedy_search(MODEL, params, EIGHT_INPUTS, options=OPTIONS, min_stage_batch=2)
    )
    # Examples end at different steps, so every stage runs: 8 rows to step 5, 4 to step 8.
    np.testing.assert_array_equal(output_lengths(staged), [9, 5, 2, 8, 8, 2, 5, 9])
    for i, row in enumerate(EIGHT_INPUTS):
        alone = decode.greedy_search(MODEL, params, row[None], options=OPTIONS)
        np.testing.assert_array_equal(staged[i], np.asarray(alone)[0])
    assert_well_formed(staged)


@pytest.mark.slow
def test_accelerator_choices_change_the_work_not_the_result(cpu_choices, monkeypatch):
    """Where the backend is not a CPU, the searches neither narrow their batch nor read the
    cache in chunks (`backends.platform`): one loop, one branch, the same outputs as a CPU's
    choices give (each set of choices under its backend's name, on any machine)."""
    from transformer.backends import platform
    from transformer.decoding import next_token
    from transformer.model import cache

    params = random_params(sharpness=2.0, seed=0, eos_logit=2.0)
    inputs = EIGHT_INPUTS[:, :5]  # a shape no other test compiles: the choices are traced anew
    on_cpu = (
        decode.greedy_search(MODEL, params, inputs, options=OPTIONS, min_stage_batch=2),
        decode.beam_search(MODEL, params, inputs, options=OPTIONS, min_stage_batch=2),
    )
    assert next_token.stage_sizes(8, 2) == [8, 4, 2] and len(cache.chunk_ends(12)) == 4
    monkeypatch.setattr(platform.jax, 'default_backend', lambda: 'gpu')
    assert (
        platform.attention_impl('auto') == 'fused' and platform.attention_impl('einsum') == 'einsum'
    )
    assert next_token.stage_sizes(8, 2) == [8] and cache.chunk_ends(12) == [12]
    assert cache.padded_length(13) == 13
    jax.clear_caches()
    elsewhere = (
        decode.greedy_search(MODEL, params, inputs, options=OPTIONS, min_stage_batch=2),
        decode.beam_search(MODEL, params, inputs, options=OPTIONS, min_stage_batch=2),
    )
    jax.clear_caches()  # nothing traced with the patched choices outlives the test
    np.testing.assert_array_equal(np.asarray(elsewhere[0]), np.asarray(on_cpu[0]))
    np.testing.assert_array_equal(np.asarray(elsewhere[1][0]), np.asarray(on_cpu[1][0]))
    np.testing.assert_allclose(np.asarray(elsewhere[1][1]), np.asarray(on_cpu[1][1]), atol=1e-5)
