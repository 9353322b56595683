"""Greedy and beam search over the decoder's key/value cache.

Shape legend (as in transformer/model/transformer.py, plus K):

    B batch · S source positions · T decoded positions (the loop length) · D d_model
    N heads · H head dim · V vocabulary · K beams

Every step feeds one token per sequence to ``Transformer.decode(..., decode=True)``, which
appends that position's keys and values to the cache, so the prefix is never recomputed. The
encoder output's keys and values for encoder-decoder attention are projected once, by
`init_cache` before the loop, and only read by the steps. The first step feeds the start
token 0, later steps the previous token.

Conventions shared by both searches:

* Output length. The paper decodes up to "input length + 50" tokens (Sec. 6.1). An example's
  limit is its own input length (its non-pad tokens, EOS included, so inputs must be
  right-padded and unpacked) plus ``extra_length``, counting the output's EOS and not the
  start token. Shapes must be static under jit, so the loop length is taken from the padded
  width S: T = S + extra_length, or ``max_decode_len`` when given; an example stops at
  min(limit, T) by allowing only EOS at its last position. Output arrays are [.., T] and only
  the number of real tokens depends on the data, so equal shapes never recompile.
* EOS is kept in the output and everything after it is 0. The pad/start token 0 is never
  generated: a 0 inside a hypothesis would read as padding to the teacher-forced model.
* Scores are sum of log-probabilities (EOS included) / length_penalty(length), the length
  counting EOS; log-probabilities are the model's own (log_softmax over all of V), not
  renormalised after forbidding 0 or forcing EOS, so a score is always the model's
  log-probability of exactly that sequence.
* Ensembles. ``params`` may be an `Ensemble` of M models of one architecture
  (`ensemble_params`): the next-token distribution is then the mean of the members'
  probabilities (`next_token.Ensemble`), and scores are that mixture's log-probability of
  the sequence over the length penalty.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer.decoding.beam import beam_search
from transformer.decoding.next_token import (
    Ensemble,
    decode_length,
    encode_and_cache,
    ensemble_params,
    forbid,
    length_penalty,
    next_scores,
    output_limits,
    shrinking_loop,
    stage_sizes,
)
from transformer.model import EOS_ID, PAD_ID, Transformer

# The decoding API in one place: beam search lives in transformer/decoding/beam.py, the step both
# searches share in transformer/decoding/next_token.py.
__all__ = [
    'Ensemble',
    'beam_search',
    'ensemble_params',
    'greedy_search',
    'length_penalty',
    'translate_batch',
]

Array = jax.Array
Params = Any


class _GreedyState(NamedTuple):
    step: Array  # tokens decoded so far
    tokens: Array  # [B, T] output, 0 from `step` on and after EOS
    last_tokens: Array  # [B] the token fed at this step
    done: Array  # [B] produced EOS
    cache: Any
    inputs: Array  # [B, S]
    limits: Array  # [B] output limits (`output_limits`)
    encoded: Array  # [B, S, D] (a tuple of them for an ensemble); the steps never read it


_GREEDY_STATIC = ('model', 'max_decode_len', 'extra_length', 'min_stage_batch')


@functools.partial(jax.jit, static_argnames=_GREEDY_STATIC)
def greedy_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    max_decode_len: int | None = None,
    extra_length: int = 50,
    min_stage_batch: int = 8,
) -> Array:
    """Greedy decoding: the most probable token at every step.

    Args:
      model: the Transformer (static: a new model or config compiles anew).
      params: its parameters, or an `Ensemble` (the most probable token of the members' mean
        distribution is taken).
      inputs: right-padded source tokens [B, S] int32.
      max_decode_len: loop length T; defaults to S + extra_length.
      extra_length: an example's output may have at most its input length + this many tokens,
        EOS included (input length + 50, Sec. 6.1).
      min_stage_batch: the batch shrinks as its examples produce EOS, down to this many rows
        (`next_token.shrinking_loop`).

    Returns:
      [B, T] int32 tokens, EOS included where produced, 0 after it. The loop ends as soon as
      every example has produced EOS.
    """
    batch, width = inputs.shape
    loop_length = decode_length(width, max_decode_len, extra_length)
    encoded, cache = encode_and_cache(model, params, inputs, loop_length)

    def decode_step(state: _GreedyState) -> _GreedyState:
        logits, cache = next_scores(
            *(model, params, state.cache, state.encoded, state.inputs, state.last_tokens),
            normalized=False,
        )
        # log_softmax keeps each row's order: the argmax of the logits is greedy's token
        # (ties to the lower index). XLA's CPU top_k(., 1) took ~4x argmax's time here.
        at_limit = state.step + 1 >= state.limits
        best = jnp.argmax(forbid(logits, at_limit), axis=-1).astype(jnp.int32)
        next_tokens = jnp.where(state.done, PAD_ID, best)
        return state._replace(
            step=state.step + 1,
            tokens=state.tokens.at[:, state.step].set(next_tokens),
            last_tokens=next_tokens,
            done=state.done | (next_tokens == EOS_ID),
            cache=cache,
        )

    state = _GreedyState(
        step=jnp.array(0, jnp.int32),
        tokens=jnp.zeros((batch, loop_length), jnp.int32),
        last_tokens=jnp.full((batch,), PAD_ID, jnp.int32),
        done=jnp.zeros((batch,), bool),
        cache=cache,
        inputs=inputs,
        limits=output_limits(inputs, loop_length, extra_length),
        encoded=encoded,
    )
    _, tokens = shrinking_loop(
        decode_step,
        state,
        more_steps=lambda state: state.step < loop_length,
        searching=lambda state: ~state.done,
        sizes=stage_sizes(batch, min_stage_batch),
        outputs=lambda state: state.tokens,
    )
    return tokens


def translate_batch(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_decode_len: int | None = None,
    extra_length: int = 50,
) -> Array:
    """Best output tokens [B, T]: greedy search for ``beam_size == 1``, else beam search.

    Greedy is not beam search with one beam: that one would still weigh every EOS on its
    path by the length penalty, and here beam 1 means the cheaper plain greedy decode.
    """
    if beam_size == 1:
        return greedy_search(
            model,
            params,
            inputs,
            max_decode_len=max_decode_len,
            extra_length=extra_length,
        )
    sequences, _ = beam_search(
        model,
        params,
        inputs,
        beam_size=beam_size,
        alpha=alpha,
        max_decode_len=max_decode_len,
        extra_length=extra_length,
    )
    return sequences[:, 0]
