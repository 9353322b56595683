"""Greedy search over the decoder's key/value cache.

Shape legend (as in transformer/model/transformer.py, plus K):

    B batch · S source positions · T decoded positions (the loop length) · D d_model
    N heads · H head dim · V vocabulary · K beams

Every step feeds one token per sequence to ``Transformer.decode(..., decode=True)``, which
appends that position's keys and values to the cache, so the prefix is never recomputed. The
encoder output's keys and values for encoder-decoder attention are projected once, by
`init_cache` before the loop, and only read by the steps. The first step feeds the start
token (the model's ``config.special.decoder_start``: 0 for the joint vocabulary), later steps
the previous token.

The conventions both searches share (output length, EOS, scores, ensembles) are written in
the package's public API, transformer/decoding/__init__.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer.decoding.constraints import (
    Constraints,
    Controls,
    advance,
    constrain,
    init_controls,
)
from transformer.decoding.next_token import (
    DEFAULT_RULES,
    StepRules,
    decode_length,
    encode_and_cache,
    forbid,
    next_scores,
    output_limits,
    shrinking_loop,
    stage_sizes,
)
from transformer.model import Transformer

Array = jax.Array
Params = Any


class TokenState(NamedTuple):
    """The state of a search that picks one token per row and step (greedy, sampling)."""

    step: Array  # tokens decoded so far
    tokens: Array  # [R, T] output, the pad id from `step` on and after EOS
    last_tokens: Array  # [R] the token fed at this step
    done: Array  # [R] produced EOS
    cache: Any
    inputs: Array  # [R, S]
    limits: Array  # [R] output limits (`output_limits`)
    encoded: Array  # [R, S, D] (a tuple of them for an ensemble); the steps never read it
    controls: Controls | None  # constraints and prefixes (`constraints.init_controls`)
    draws: Any  # what choosing a token carries (sampling's), with ``log_probs`` [R]; or None


def token_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    choose: Callable[[Array, TokenState], tuple[Array, Any]],
    draws: Any,
    controls: Controls | None,
    loop_length: int,
    extra_length: int,
    min_stage_batch: int,
    normalized: bool,
    rules: StepRules = DEFAULT_RULES,
) -> tuple[Array, Array | None]:
    """Runs ``choose(scores, state) -> (tokens [R], draws)`` each step on the next-token logits
    (log-probs with ``normalized``; `forbid` with ``rules``): tokens [R, T], draws.log_probs [R]."""
    (rows, _), special = inputs.shape, model.config.special
    encoded, cache = encode_and_cache(model, params, inputs, loop_length)

    def decode_step(state: TokenState) -> TokenState:
        scores, cache = next_scores(
            *(model, params, state.cache, state.encoded, state.inputs, state.last_tokens),
            normalized=normalized,
        )
        at_limit = state.step + 1 >= state.limits
        scores = forbid(scores, at_limit, special, rules)
        scores = constrain(scores, state.controls, state.step, state.tokens, at_limit, special)
        chosen, draws = choose(scores, state)
        next_tokens = jnp.where(state.done, special.pad, chosen)
        return state._replace(
            step=state.step + 1,
            tokens=state.tokens.at[:, state.step].set(next_tokens),
            last_tokens=next_tokens,
            done=state.done | (next_tokens == special.eos) | _cut(at_limit, rules),
            cache=cache,
            controls=advance(state.controls, state.tokens, next_tokens),
            draws=draws,
        )

    state = TokenState(
        step=jnp.array(0, jnp.int32),
        tokens=jnp.full((rows, loop_length), special.pad, jnp.int32),
        last_tokens=jnp.full((rows,), special.decoder_start, jnp.int32),
        done=jnp.zeros((rows,), bool),
        cache=cache,
        inputs=inputs,
        limits=output_limits(inputs, loop_length, extra_length, special.pad),
        encoded=encoded,
        controls=controls,
        draws=draws,
    )
    _, outputs = shrinking_loop(
        decode_step,
        state,
        more_steps=lambda state: state.step < loop_length,
        searching=lambda state: ~state.done,
        sizes=stage_sizes(rows, min_stage_batch),
        outputs=lambda state: (state.tokens, None if draws is None else state.draws.log_probs),
    )
    return outputs


def _cut(at_limit: Array, rules: StepRules) -> Array | bool:
    """[R] the rows an output ends at without EOS: at their limit, with no EOS forced there
    (``rules.eos_at_limit`` 'none'; otherwise only EOS may come there: False)."""
    return at_limit if rules.eos_at_limit == 'none' else False


def _argmax(logits: Array, state: TokenState) -> tuple[Array, None]:
    # log_softmax keeps each row's order: the argmax of the logits is greedy's token
    # (ties to the lower index). XLA's CPU top_k(., 1) took ~4x argmax's time here.
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None


_GREEDY_STATIC = ('model', 'max_decode_len', 'extra_length', 'min_stage_batch', 'rules')


@functools.partial(jax.jit, static_argnames=_GREEDY_STATIC)
def greedy_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    max_decode_len: int | None = None,
    extra_length: int = 50,
    min_stage_batch: int = 8,
    constraints: Constraints | None = None,
    prefixes: Array | None = None,
    rules: StepRules = DEFAULT_RULES,
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
      constraints: a minimum length and n-gram blocking (`constraints.Constraints`, traced).
      prefixes: [B, P] int32 target prefixes the outputs start with (forced first tokens, a
        target-language code), right-padded with the pad id (`constraints`).
      rules: the length limit's rule (`next_token.StepRules`; renormalising changes no argmax).

    Returns:
      [B, T] int32 tokens, EOS included where produced, the pad id after it. The loop ends as
      soon as every example has produced EOS (or, with ``rules.eos_at_limit`` 'none',
      reached its limit, where it ends without EOS).
    """
    batch, width = inputs.shape
    loop_length = decode_length(width, max_decode_len, extra_length)
    tokens, _ = token_search(
        model,
        params,
        inputs,
        choose=_argmax,
        draws=None,
        controls=init_controls(constraints, prefixes, batch, loop_length),
        loop_length=loop_length,
        extra_length=extra_length,
        min_stage_batch=min_stage_batch,
        normalized=False,
        rules=rules,
    )
    return tokens
