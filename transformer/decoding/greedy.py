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
    encode_and_cache,
    forbid,
    next_scores,
    output_limits,
    shrinking_loop,
    stage_sizes,
)
from transformer.decoding.options import DEFAULT_OPTIONS, DecodeOptions
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
    options: DecodeOptions,
    min_stage_batch: int,
    normalized: bool,
) -> tuple[Array, Array | None]:
    """Runs ``choose(scores, state) -> (tokens [R], draws)`` each step on the next-token logits
    (log-probs with ``normalized``; `forbid` by ``options``, static): tokens [R, T],
    draws.log_probs [R]."""
    (rows, _), special = inputs.shape, model.config.special
    encoded, cache = encode_and_cache(model, params, inputs, loop_length)

    def decode_step(state: TokenState) -> TokenState:
        fed = (state.cache, state.encoded, state.inputs, state.last_tokens)
        scores, cache = next_scores(model, params, *fed, normalized=normalized)
        at_limit = state.step + 1 >= state.limits
        allowed = forbid(scores, at_limit, special, options)
        controls = (state.controls, state.step, state.tokens, at_limit, special)
        scores = constrain(allowed, *controls, scores)
        chosen, draws = choose(scores, state)
        next_tokens = jnp.where(state.done, special.pad, chosen)
        return state._replace(
            step=state.step + 1,
            tokens=state.tokens.at[:, state.step].set(next_tokens),
            last_tokens=next_tokens,
            done=state.done | (next_tokens == special.eos) | _cut(at_limit, options),
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
        limits=output_limits(inputs, loop_length, options.extra_length, special.pad),
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


def _cut(at_limit: Array, options: DecodeOptions) -> Array | bool:
    """[R] the rows an output ends at without EOS: at their limit, with no EOS forced there
    (``options.eos_at_limit`` 'none'; otherwise only EOS may come there: False)."""
    return at_limit if options.eos_at_limit == 'none' else False


def _argmax(logits: Array, state: TokenState) -> tuple[Array, None]:
    # log_softmax keeps each row's order: the argmax of the logits is greedy's token
    # (ties to the lower index). XLA's CPU top_k(., 1) took ~4x argmax's time here.
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None


def greedy_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    options: DecodeOptions = DEFAULT_OPTIONS,
    min_stage_batch: int = 8,
    constraints: Constraints | None = None,
) -> Array:
    """Greedy decoding: the most probable token at every step.

    Args:
      model: the Transformer (static: a new model or config compiles anew).
      params: its parameters, or an `Ensemble` (the most probable token of the members' mean
        distribution is taken).
      inputs: right-padded source tokens [B, S] int32.
      options: the length limit, the rule at it, the ids never emitted, the forced first ids
        and the per-row prefixes [B, P] (`DecodeOptions`; the length penalty and
        renormalising change no argmax).
      min_stage_batch: the batch shrinks as its examples produce EOS, down to this many rows
        (`next_token.shrinking_loop`).
      constraints: a minimum length and n-gram blocking (`constraints.Constraints`, traced).

    Returns:
      [B, T] int32 tokens, EOS included where produced, the pad id after it. The loop ends as
      soon as every example has produced EOS (or, with ``options.eos_at_limit`` 'none',
      reached its limit, where it ends without EOS).
    """
    options.check_forced(model.config.special)
    return _greedy_search(
        model, params, inputs, options=options.static, prefixes=options.prefixes,
        min_stage_batch=min_stage_batch, constraints=constraints,
    )  # fmt: skip


@functools.partial(jax.jit, static_argnames=('model', 'options', 'min_stage_batch'))
def _greedy_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    options: DecodeOptions,
    prefixes: Array | None,
    min_stage_batch: int,
    constraints: Constraints | None,
) -> Array:
    """`greedy_search` with its options' static part (``options``) and ``prefixes`` apart."""
    batch, width = inputs.shape
    loop_length = options.loop_length(width)
    tokens, _ = token_search(
        model,
        params,
        inputs,
        choose=_argmax,
        draws=None,
        controls=init_controls(constraints, options.with_prefixes(prefixes), batch, loop_length),
        loop_length=loop_length,
        options=options,
        min_stage_batch=min_stage_batch,
        normalized=False,
    )
    return tokens
