"""The searches at NLLB-200's vocabulary of 256206 pieces: beam search flattens [K, V]
candidates into K * V (6.9M here) and recovers each one's parent beam and token with // and %,
through the blocked top-k of transformer/decoding/next_token.py; the tokens it keeps are ids
past uint16, up to the last one, 256205.

A tiny model (d_model 8, 1 + 1 layers, an untied output projection) with random parameters,
rigged as tests/decoding/test_decode.py's are: channel 0 of the decoder's output is pinned to 1,
so row 0 of the output projection is a logit bias, which gives every token but EOS and three
high ids (the last among them) a logit 40 below theirs. A sequence holding any other token is
then e^-40 less likely than all of the candidates' sequences, and the exhaustive search over
the candidates alone is the exhaustive search over the vocabulary.
"""

import functools
import itertools

import jax
import numpy as np
import pytest

from tests.random_params import fill_random
from transformer import decoding as decode
from transformer.decoding import next_token
from transformer.model import EOS_ID, PAD_ID, Transformer, TransformerConfig, abstract_params

V = 256_206
LAST = V - 1
CONTENT = (LAST, LAST - 1, 65_536)  # the tokens a sequence may hold before its EOS
MODEL = Transformer(
    TransformerConfig(
        vocab_size=V,
        d_model=8,
        num_heads=2,
        d_ff=16,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout_rate=0.0,
        share_embeddings='none',
        attention_impl='einsum',
    )
)
INPUTS = np.array([[5, LAST, 7, 1], [65_536, 1, 0, 0]], np.int32)
EXTRA = 0  # output limits 4 and 2: at most 3 and 1 tokens before the EOS


def test_top_k_over_beams_times_the_vocabulary_recovers_beam_and_token():
    """The best candidates of a [B, K * V] row at its very end (beam 3, token 256205) and in
    the middle come back with their flat indices, // V and % V giving beam and token."""
    scores = np.full((2, 4 * V), -5.0, np.float32)
    scores[0, 3 * V + LAST] = 2.0
    scores[0, 1 * V + 65_536] = 1.0
    scores[1, 2 * V + 0] = 3.0
    scores[1, 3 * V + LAST] = 2.5
    values, flat = jax.jit(next_token.top_k, static_argnums=1)(scores, 2)
    flat = np.asarray(flat)
    np.testing.assert_array_equal(np.asarray(values), [[2.0, 1.0], [3.0, 2.5]])
    np.testing.assert_array_equal(flat // V, [[3, 1], [2, 3]])
    np.testing.assert_array_equal(flat % V, [[LAST, 65_536], [0, LAST]])


@functools.cache
def _params() -> dict:
    params = fill_random(abstract_params(MODEL), seed=2, logits_scale=1.5)
    norm = params['decoder_layer_0']['ffn_norm']
    norm['scale'][0], norm['bias'][0] = 0.0, 1.0
    bias = params['logits_dense']['kernel'][0]  # [V]
    bias[:] = -40.0
    bias[[EOS_ID, *CONTENT]] = [1.0, 3.0, 2.0, 1.5]
    return params


@jax.jit
def _log_probs(params, inputs, targets):
    return jax.nn.log_softmax(MODEL.apply({'params': params}, inputs, targets))


def _sequence_log_probs(inputs, targets) -> np.ndarray:
    log_probs = np.asarray(_log_probs(_params(), inputs, targets))
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return np.where(targets != PAD_ID, picked, 0.0).sum(-1)


@pytest.mark.slow
def test_a_beam_as_wide_as_every_prefix_equals_exhaustive_search():
    """Beam 27 keeps every prefix of 3 candidate tokens alive: its hypotheses are the best
    of all sequences, with their scores, and every token sits where the search put it."""
    beam = len(CONTENT) ** 3
    sequences, scores = decode.beam_search(
        MODEL, _params(), INPUTS, beam_size=beam, options=decode.DecodeOptions(extra_length=EXTRA)
    )
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    width = sequences.shape[-1]
    every_candidate = [
        np.array(
            [
                [*prefix, EOS_ID] + [PAD_ID] * (width - n - 1)
                for n in range(limit)
                for prefix in itertools.product(CONTENT, repeat=n)
            ],
            np.int32,
        )
        for limit in (4, 2)
    ]
    # Both sources' candidates in one forward pass (one compiled shape).
    counts = [len(c) for c in every_candidate]
    log_probs = _sequence_log_probs(
        np.repeat(INPUTS, counts, axis=0), np.concatenate(every_candidate)
    )
    log_probs = np.split(log_probs, [counts[0]])
    for b, candidates in enumerate(every_candidate):
        lengths = (candidates != PAD_ID).sum(-1)
        every = log_probs[b] / ((5.0 + lengths) / 6.0) ** 0.6
        best = np.argsort(-every, kind='stable')[:beam]
        found = len(best)  # 27 of the 40 sequences for limit 4; all 4 for limit 2
        np.testing.assert_array_equal(sequences[b, :found], candidates[best])
        np.testing.assert_allclose(scores[b, :found], every[best], rtol=1e-5, atol=1e-4)
        # The slots left over hold sequences with another token: e^-40 less likely.
        assert np.all(scores[b, found:] < every.min() - 20)
        for other in sequences[b, found:]:
            assert not np.isin(other[other != PAD_ID], [EOS_ID, *CONTENT]).all()
    assert LAST in sequences[0, 0] and sequences.max() == LAST


@pytest.mark.slow
def test_greedy_takes_the_best_token_up_to_the_last_id():
    """Greedy's tokens are the argmax of the full forward pass over the prefix, step by step:
    the last id, 256205, first."""
    tokens = np.asarray(
        decode.greedy_search(
            MODEL, _params(), INPUTS[:1], options=decode.DecodeOptions(extra_length=EXTRA)
        )
    )
    prefix = np.full((1, tokens.shape[1]), 2, np.int32)  # later positions are hidden
    for t in range(tokens.shape[1]):
        log_probs = np.array(_log_probs(_params(), INPUTS[:1], prefix))[0, t]
        log_probs[PAD_ID] = -np.inf
        prefix[0, t] = log_probs.argmax() if t < 3 else EOS_ID  # the limit forces EOS
        if prefix[0, t] == EOS_ID:
            prefix[0, t + 1 :] = PAD_ID
            break
    np.testing.assert_array_equal(tokens, prefix)
    assert tokens[0, 0] == LAST
