"""A vocabulary whose special ids are not the joint ones, as NLLB-200's: ``<s>`` 0, pad 1,
``</s>`` 2 (also the decoder's start, which is not the pad id), unk 3, and ``<s>`` never
emitted. Teacher forcing, greedy and beam search start from the decoder's start token; forced
first target tokens (a target-language code) come out first; never-emitted ids never appear.

The references are computed apart from the code under test: the cached decoder fed the start
token by hand, one step at a time (`transformer.model.decode_step`), and argmaxes and sums of
its log-probabilities.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.random_params import fill_random
from transformer import decoding
from transformer.decoding.scoring import token_log_probs
from transformer.model import Transformer, TransformerConfig, decode_step, encode, init_cache
from transformer.tokens import SpecialIds

V = 12
BOS, PAD, EOS, UNK = 0, 1, 2, 3
LANGUAGE_CODE = 11  # a target-language token, forced first
NATIVE = SpecialIds(pad=PAD, eos=EOS, unk=UNK, decoder_start=EOS, never_emit=(BOS, PAD))
EXTRA = 4
# Right-padded with pad 1, each ending with eos 2.
INPUTS = np.array([[4, 5, 6, EOS], [7, EOS, PAD, PAD], [8, 9, EOS, PAD]], np.int32)
WIDTH = INPUTS.shape[1] + EXTRA  # the searches' loop length


def _model(special: SpecialIds) -> Transformer:
    config = TransformerConfig(
        vocab_size=V,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout_rate=0.0,
        share_embeddings='none',  # a random tied model mostly repeats its input
        attention_impl='einsum',
        special=special,
    )
    return Transformer(config)


MODEL = _model(NATIVE)


@functools.cache
def _params() -> dict:
    """Random parameters whose logits favour ``<s>`` (0) by far and EOS a little: a search
    that let a never-emitted id through would output it, and outputs end within the limit."""
    tokens = jnp.ones((1, 2), jnp.int32)
    shapes = nn.unbox(jax.eval_shape(MODEL.init, jax.random.key(0), tokens, tokens)['params'])
    params = fill_random(shapes, 3, logits_scale=2.0)
    # Channel 0 of the decoder's output is pinned to 1: row 0 of the projection is a logit bias.
    last_norm = params['decoder_layer_0']['ffn_norm']
    last_norm['scale'][0], last_norm['bias'][0] = 0.0, 1.0
    kernel = params['logits_dense']['kernel']  # [D, V]
    kernel[0] = 0.0
    kernel[0, BOS], kernel[0, EOS] = 30.0, 1.0
    return params


@functools.partial(jax.jit, static_argnums=0)
def _stepped(model: Transformer, params: dict, inputs: jax.Array, fed: jax.Array) -> jax.Array:
    encoded = encode(model, params, inputs)
    cache = init_cache(model, params, encoded, inputs, fed.shape[1])
    out = []
    for t in range(fed.shape[1]):  # unrolled: T is small
        logits, cache = decode_step(model, params, cache, encoded, inputs, fed[:, t])
        out.append(jax.nn.log_softmax(logits.astype(jnp.float32)))
    return jnp.stack(out, axis=1)


def _stepped_log_probs(model: Transformer, inputs: np.ndarray, targets: np.ndarray):
    """[B, T, V] log-probabilities of the cached decoder fed ``decoder_start`` and then each
    target token by hand: the reference for teacher forcing and the searches."""
    start = np.full((len(targets), 1), model.config.special.decoder_start)
    fed = np.concatenate([start, targets[:, :-1]], 1).astype(np.int32)
    return np.asarray(_stepped(model, _params(), jnp.asarray(inputs), jnp.asarray(fed)))


def _padded(targets: list[list[int]]) -> np.ndarray:
    """Targets right-padded with the pad id to the searches' loop length (one compiled shape)."""
    out = np.full((len(targets), WIDTH), PAD, np.int32)
    for row, tokens in enumerate(targets):
        out[row, : len(tokens)] = tokens
    return out


def _length(row: np.ndarray) -> int:
    return int(np.argmax(row == EOS)) + 1


def test_teacher_forcing_starts_from_the_decoder_start_not_the_pad():
    targets = _padded([[5, 6, 7, EOS], [8, EOS], [9, 10, EOS]])
    got = np.asarray(token_log_probs(MODEL, _params(), jnp.asarray(INPUTS), jnp.asarray(targets)))
    steps = _stepped_log_probs(MODEL, INPUTS, targets)
    want = np.take_along_axis(steps, targets[..., None], -1)[..., 0]
    want = np.where(targets != PAD, want, 0.0)
    np.testing.assert_allclose(got, want, atol=1e-5)  # float32, einsum on one device
    # The same model started from the pad id scores otherwise: the start token is read.
    from_pad = _model(SpecialIds(PAD, EOS, UNK, decoder_start=PAD, never_emit=(BOS,)))
    other = np.asarray(token_log_probs(from_pad, _params(), jnp.asarray(INPUTS), targets))
    assert np.abs(other - got).max() > 1e-2


def _check_greedy_choices(model, outputs: np.ndarray, prefix: int | None) -> None:
    """Each output token is the most probable allowed one given the tokens before it (the
    forced prefix's first), the pad id after EOS; no never-emitted id anywhere."""
    steps = _stepped_log_probs(model, INPUTS, outputs)
    allowed = steps.copy()
    allowed[..., list(model.config.special.never_emit)] = -np.inf
    for row, tokens in enumerate(outputs):
        n = _length(tokens)
        assert tokens[n - 1] == EOS and (tokens[n:] == PAD).all()
        assert not np.isin(tokens[:n], model.config.special.never_emit).any()
        limit = int((INPUTS[row] != PAD).sum()) + EXTRA
        for t in range(n if n < limit else n - 1):  # the last allowed position forces EOS
            if t == 0 and prefix is not None:
                assert tokens[0] == prefix
            else:
                assert tokens[t] == np.argmax(allowed[row, t]), (row, t)
        # Unforbidden, <s> would win: never_emit is what keeps it out.
        assert np.argmax(steps[row, n - 1]) == BOS


@pytest.mark.parametrize('prefix', [None, LANGUAGE_CODE])
def test_greedy_starts_from_the_decoder_start_and_never_emits_the_banned_ids(prefix):
    prefixes = None if prefix is None else np.full((len(INPUTS), 1), prefix, np.int32)
    outputs = np.asarray(
        decoding.greedy_search(
            MODEL, _params(), INPUTS, options=decoding.DecodeOptions(EXTRA, prefixes=prefixes)
        )
    )
    _check_greedy_choices(MODEL, outputs, prefix)


@pytest.mark.parametrize('prefix', [None, LANGUAGE_CODE])
def test_beam_scores_are_the_stepped_log_probabilities_of_their_outputs(prefix):
    """Beam search's hypotheses start with the forced token, end with EOS, hold no banned id,
    and each score is the log-probability the decoder fed its start token gives them (the
    forced token's included) over GNMT's penalty of their length."""
    prefixes = None if prefix is None else np.full((len(INPUTS), 1), prefix, np.int32)
    sequences, scores = decoding.beam_search(
        MODEL, _params(), INPUTS, beam_size=3,
        options=decoding.DecodeOptions(EXTRA, prefixes=prefixes),
    )  # fmt: skip
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    assert np.isfinite(scores).all()
    for k in range(3):  # the k-th hypothesis of every row: one compiled shape
        steps = _stepped_log_probs(MODEL, INPUTS, sequences[:, k])
        for row, tokens in enumerate(sequences[:, k]):
            n = _length(tokens)
            assert tokens[n - 1] == EOS and (tokens[n:] == PAD).all()
            assert not np.isin(tokens[:n], NATIVE.never_emit).any()
            if prefix is not None:
                assert tokens[0] == prefix
            log_prob = steps[row, np.arange(n), tokens[:n]].sum()
            want = log_prob / ((5 + n) / 6) ** 0.6
            np.testing.assert_allclose(scores[row, k], want, atol=1e-4)


@pytest.mark.parametrize('loss_chunk_tokens', [0, 4])
def test_the_loss_masks_the_vocabularys_pad_and_starts_from_its_start(loss_chunk_tokens):
    """The training loss's NLL and token count (the logits' loss and the chunked one) are the
    stepped decoder's over the tokens that are not the pad id 1 (0 is a real token here)."""
    from transformer.training import steps

    targets = _padded([[5, BOS, 7, EOS], [8, EOS], [BOS, 10, EOS]])
    static = ('model', 'label_smoothing', 'loss_chunk_tokens')
    eval_step = jax.jit(steps.eval_step, static_argnames=static)
    sums = eval_step(
        _params(),
        {'inputs': INPUTS, 'targets': targets},
        model=MODEL,
        label_smoothing=0.0,
        loss_chunk_tokens=loss_chunk_tokens,
    )
    log_probs = np.take_along_axis(
        _stepped_log_probs(MODEL, INPUTS, targets), targets[..., None], -1
    )
    real = targets != PAD
    assert float(sums['tokens']) == real.sum() == 9
    np.testing.assert_allclose(float(sums['nll']), -log_probs[..., 0][real].sum(), rtol=1e-5)
