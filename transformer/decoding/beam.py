"""Beam search over the decoder's key/value cache, the cache rows following their hypotheses.

Shapes as in `transformer.decoding.greedy` (B batch, K beams, T the loop length, V vocabulary); the
output-length, EOS, score and ensemble conventions are those of its docstring.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer.decoding.constraints import (
    Constraints,
    Controls,
    advance,
    constrain,
    init_controls,
    take_rows,
)
from transformer.decoding.next_token import (
    encode_and_cache,
    forbid,
    map_cache,
    next_scores,
    output_limits,
    shrinking_loop,
    stage_sizes,
    top_k,
)
from transformer.decoding.next_token import length_penalty as penalty
from transformer.decoding.options import DEFAULT_OPTIONS, DecodeOptions
from transformer.model import (
    Transformer,
    beam_mask,
    padded_length,
    share_across_beams,
)

Array = jax.Array
Params = Any
Cache = Any


class _BeamState(NamedTuple):
    step: Array  # tokens in every alive hypothesis so far
    alive_seqs: Array  # [B, K, T] hypotheses without EOS yet, 0 from `step` on
    alive_log_probs: Array  # [B, K], sorted best first; -inf = empty slot
    finished_seqs: Array  # [B, K, T] hypotheses ending in EOS
    finished_scores: Array  # [B, K] log-prob / length penalty, sorted best first; -inf = empty
    history: Array  # [B*K, T'] the cache slot of each position of alive_seqs[b, k], row b*K + k
    cache: Cache  # `cache.share_across_beams`
    inputs: Array  # [B*K, S] each row's source
    limits: Array  # [B*K] each row's output limit (`output_limits`)
    encoded: Array  # [B, S, D] (a tuple of them for an ensemble); the steps never read it
    controls: Controls | None  # constraints and prefixes, one row per hypothesis


_BEAM_STATIC = ('model', 'beam_size', 'options', 'early_stop', 'min_stage_batch')


@functools.partial(jax.jit, static_argnames=_BEAM_STATIC)
def _beam_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    alpha: Array,
    rule: Array,
    beam_size: int,
    options: DecodeOptions,
    early_stop: bool,
    min_stage_batch: int = 8,
    constraints: Constraints | None = None,
    prefixes: Array | None = None,
) -> tuple[Array, Array, Array]:
    """`beam_search`'s sequences and scores, and the number of steps it ran.

    ``alpha`` (float32) and ``rule`` (int32, `next_token.penalty_rule`) are traced: every
    length penalty setting runs the one program compiled for the model, beam and shape.

    With ``early_stop``, the batch shrinks as its examples finish (`shrinking_loop`, down to
    ``min_stage_batch`` rows): a finished example's result can no longer change, and the
    examples of a batch finish at very different steps.

    ``options`` is `DecodeOptions.static` (static), ``prefixes`` its per-row prefixes and
    ``constraints`` as `beam_search`'s (None: the search compiles as without them).
    """
    batch, width = inputs.shape
    rows = batch * beam_size
    loop_length = options.loop_length(width)
    special = model.config.special
    limits = output_limits(inputs, loop_length, options.extra_length, special.pad)
    cache_length = padded_length(loop_length)
    encoded, cache = encode_and_cache(model, params, inputs, cache_length)

    def searching(state: _BeamState) -> Array:
        """[B] whether each example's finished set may still change."""
        if not early_stop:
            return jnp.ones(state.alive_log_probs.shape[:1], bool)
        # Log-probs only fall as tokens are added, so an alive hypothesis can at best keep
        # its log-prob and divide it by the largest penalty still reachable (the limit's for
        # alpha >= 0: both rules grow with the length). An example is done once the worst of
        # its K finished beats that: then no finished hypothesis can be displaced any more.
        max_penalty = penalty(state.limits[::beam_size], alpha, rule)  # [B]
        best_penalty = jnp.maximum(penalty(state.step + 1, alpha, rule), max_penalty)
        best_alive = state.alive_log_probs[:, 0] / best_penalty
        return state.finished_scores[:, -1] < best_alive

    def decode_step(state: _BeamState) -> _BeamState:
        step = state.step
        rows, _ = state.inputs.shape
        last_tokens = jnp.where(
            step > 0,
            jax.lax.dynamic_index_in_dim(
                state.alive_seqs, jnp.maximum(step - 1, 0), axis=2, keepdims=False
            ),
            special.decoder_start,
        )
        # Each row writes position `step` into its own slot and reads its hypothesis' slots.
        own_slots = jnp.arange(rows, dtype=jnp.int32) % beam_size
        history = state.history.at[:, step].set(own_slots)
        cache_mask = beam_mask(history, beam_size)
        # Steps never read `encoded`: its keys/values are cached.
        log_probs, cache = next_scores(
            *(model, params, state.cache, state.encoded, state.inputs, last_tokens.reshape(-1)),
            cache_mask,
            normalized=True,
        )
        at_limit = step + 1 >= state.limits
        log_probs = _allowed(log_probs, at_limit, state, special, options)
        vocab = log_probs.shape[-1]
        log_probs = state.alive_log_probs[:, :, None] + log_probs.reshape(-1, beam_size, vocab)
        cut = at_limit[::beam_size] if options.eos_at_limit == 'none' else None
        finished_seqs, finished_scores = _offer_finished(
            state, log_probs, alpha, rule, special.eos, cut
        )

        # The K best continuations that do not end here stay alive.
        alive_log_probs, flat = top_k(_continuing(log_probs, special.eos, cut), beam_size)
        parents, tokens = flat // vocab, flat % vocab
        parent_seqs = jnp.take_along_axis(state.alive_seqs, parents[:, :, None], axis=1)
        alive_seqs = parent_seqs.at[:, :, step].set(tokens.astype(jnp.int32))
        row_offsets = jnp.arange(rows // beam_size)[:, None] * beam_size
        parent_rows = (row_offsets + parents).reshape(-1)
        history = jnp.take(history, parent_rows, axis=0)
        controls = advance(
            take_rows(state.controls, parent_rows),
            parent_seqs.reshape(rows, -1),
            tokens.reshape(-1).astype(jnp.int32),
        )
        return state._replace(
            step=step + 1,
            alive_seqs=alive_seqs,
            alive_log_probs=alive_log_probs,
            finished_seqs=finished_seqs,
            finished_scores=finished_scores,
            history=history,
            cache=cache,
            controls=controls,
        )

    state = _BeamState(
        step=jnp.array(0, jnp.int32),
        alive_seqs=jnp.full((batch, beam_size, loop_length), special.pad, jnp.int32),
        # All K beams start identical; only the first may expand, or the K copies would fill
        # the beam with the same hypothesis.
        alive_log_probs=jnp.full((batch, beam_size), -jnp.inf).at[:, 0].set(0.0),
        finished_seqs=jnp.full((batch, beam_size, loop_length), special.pad, jnp.int32),
        finished_scores=jnp.full((batch, beam_size), -jnp.inf),
        history=jnp.zeros((rows, cache_length), jnp.int32),
        cache=map_cache(lambda c: share_across_beams(c, beam_size), cache, params),
        inputs=jnp.repeat(inputs, beam_size, axis=0),
        limits=jnp.repeat(limits, beam_size),
        encoded=encoded,
        controls=init_controls(
            constraints, options.with_prefixes(prefixes), rows, loop_length, beam_size
        ),
    )
    state, (sequences, scores) = shrinking_loop(
        decode_step,
        state,
        more_steps=lambda state: state.step < loop_length,
        searching=searching,
        sizes=stage_sizes(batch, min_stage_batch) if early_stop else [batch],
        outputs=lambda state: (state.finished_seqs, state.finished_scores),
    )
    # Slots no hypothesis reached (tiny vocabularies) hold no sequence.
    sequences = jnp.where(jnp.isfinite(scores)[:, :, None], sequences, special.pad)
    return sequences, scores, state.step


def _allowed(
    log_probs: Array, at_limit: Array, state: _BeamState, special: Any, options: DecodeOptions
) -> Array:
    """The step's log-probabilities [B*K, V] with the tokens each row may not take at -inf
    (`forbid`, `constrain`), taken through log_softmax again with ``options.renormalize``."""
    rows = at_limit.shape[0]
    allowed = constrain(
        forbid(log_probs, at_limit, special, options), state.controls, state.step,
        state.alive_seqs.reshape(rows, -1), at_limit, special, log_probs,
    )  # fmt: skip
    return jax.nn.log_softmax(allowed) if options.renormalize else allowed


def _continuing(log_probs: Array, eos: int, cut: Array | None) -> Array:
    """[B, K*V] the extensions' log-probs [B, K, V] that may stay alive: not EOS, and none of
    an example ``cut`` marks (at its limit with no EOS forced: it ends there)."""
    continuing = log_probs.at[:, :, eos].set(-jnp.inf)
    if cut is not None:
        continuing = jnp.where(cut[:, None, None], -jnp.inf, continuing)
    return continuing.reshape(log_probs.shape[0], -1)


def _offer_finished(
    state: _BeamState,
    log_probs: Array,
    alpha: Array,
    rule: Array,
    eos: int,
    cut: Array | None = None,
) -> tuple[Array, Array]:
    """The K best of the finished set and every alive hypothesis + EOS (``log_probs``
    [B, K, V] being each extension's log-prob): every hypothesis + EOS is a candidate, not
    just those among the top candidates, so no short hypothesis is lost to a crowded beam.
    For the examples ``cut`` [B] marks (at their limit, with no EOS forced there) the
    candidates are instead the K best extensions by any token, as Hugging Face ends its beams
    at max_length."""
    beam_size = log_probs.shape[1]
    eos_seqs = state.alive_seqs.at[:, :, state.step].set(eos)
    eos_scores = log_probs[:, :, eos]
    if cut is not None:
        vocab = log_probs.shape[-1]
        best, flat = top_k(log_probs.reshape(-1, beam_size * vocab), beam_size)
        parents, tokens = flat // vocab, (flat % vocab).astype(jnp.int32)
        ends = jnp.take_along_axis(state.alive_seqs, parents[:, :, None], axis=1)
        ends = ends.at[:, :, state.step].set(tokens)
        eos_seqs = jnp.where(cut[:, None, None], ends, eos_seqs)
        eos_scores = jnp.where(cut[:, None], best, eos_scores)
    eos_scores = eos_scores / penalty(state.step + 1, alpha, rule)
    finished_scores, order = jax.lax.top_k(
        jnp.concatenate([state.finished_scores, eos_scores], axis=1), beam_size
    )
    finished_seqs = jnp.take_along_axis(
        jnp.concatenate([state.finished_seqs, eos_seqs], axis=1), order[:, :, None], axis=1
    )
    return finished_seqs, finished_scores


def beam_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    beam_size: int = 4,
    options: DecodeOptions = DEFAULT_OPTIONS,
    early_stop: bool = True,
    min_stage_batch: int = 8,
    constraints: Constraints | None = None,
) -> tuple[Array, Array]:
    """Beam search with the paper's settings: beam 4, alpha 0.6, input length + 50 (Sec. 6.1).

    Each step extends the K alive hypotheses of every example by every token, offers each
    hypothesis + EOS to the K-best finished set, and keeps the K most probable other
    extensions alive; each row's view of the cache follows its hypothesis
    (`cache.share_across_beams`).

    Args:
      model: the Transformer (static: compiled once per model, static argument and shape).
      params: its parameters, or an `Ensemble` (searched by the mean of the members'
        next-token probabilities).
      inputs: right-padded source tokens [B, S] int32.
      beam_size: K.
      options: `DecodeOptions`: the length limit and its rule, the length penalty (score =
        log P(y) / penalty(|y|), |y| counting EOS; its alpha and rule are traced: a new one
        runs the program already compiled), renormalising, the ids never emitted, the
        forced first ids and the per-row prefixes [B, P] (a prefix's log-probs count in the
        scores).
      early_stop: end once, for every example, the worst of the K finished scores is at
        least the best any alive hypothesis could still reach (the same result, sooner).
      min_stage_batch: with ``early_stop``, the batch shrinks as its examples finish, down to
        this many rows (`next_token.shrinking_loop`).
      constraints: as `greedy_search`'s.

    Returns:
      (sequences [B, K, T] int32, scores [B, K] float32), sorted best first. Sequences end in
      EOS and are the pad id after it. A slot with score -inf holds no hypothesis (only
      possible when fewer than K sequences exist).
    """
    alpha, rule = options.penalty()
    options.check_forced(model.config.special)
    sequences, scores, _ = _beam_search(
        model, params, inputs, alpha=alpha, rule=rule, beam_size=beam_size,
        options=options.static, early_stop=early_stop, min_stage_batch=min_stage_batch,
        constraints=constraints, prefixes=options.prefixes,
    )  # fmt: skip
    return sequences, scores
