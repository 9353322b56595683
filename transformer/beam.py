"""Beam search over the decoder's key/value cache, the cache rows following their hypotheses.

Shapes as in `transformer.decode` (B batch, K beams, T the loop length, V vocabulary); the
output-length, EOS, score and ensemble conventions are those of its docstring.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer.attention import CACHE_CHUNKS, STATIC_CACHE_NAMES
from transformer.model import EOS_ID, PAD_ID, Transformer
from transformer.next_token import (
    decode_length,
    encode_and_cache,
    ensemble_log_probs,
    forbid,
    length_penalty,
    map_cache,
    output_limits,
    step_logits,
    top_k,
)

Array = jax.Array
Params = Any
Cache = Any


def _reorder_cache(cache: Cache, rows: Array, written: Array, length: int) -> Cache:
    """Cache whose row r holds what row ``rows[r]`` held, for positions < ``written``.

    Entries are told apart by name. The self-attention caches ``cached_key`` / ``cached_value``
    are [B*K, N, T', H] with T' = ``length``, a multiple of `CACHE_CHUNKS`. Positions at or
    after ``written`` are left as they are: the model masks them and overwrites each before
    attending to it. So only the chunks holding written positions are gathered, each back into
    its own place (dynamic_update_slice in a loop, which XLA does in place): a step moves
    O(written * B*K * N * H) per cache instead of O(T' * B*K * N * H), and no second full-size
    buffer is allocated. The encoder-decoder caches (`STATIC_CACHE_NAMES`, one copy per
    example, shared by its K beams) are not touched, nor are scalars (``cache_index``,
    ``position``: the same for every row); any other array with a B*K axis is gathered whole.
    """
    num_rows = rows.shape[0]
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(cache)
    names = [getattr(path[-1], 'key', None) for path, _ in with_paths]
    leaves = [x for _, x in with_paths]
    kv_leaves = [i for i, name in enumerate(names) if name in ('cached_key', 'cached_value')]
    for i, (name, x) in enumerate(zip(names, leaves, strict=True)):
        if i in kv_leaves or name in STATIC_CACHE_NAMES:
            continue
        if x.ndim and x.shape[0] == num_rows:
            leaves[i] = jnp.take(x, rows, axis=0)
    chunk = length // CACHE_CHUNKS

    def reorder_chunk(c, kv):
        start = c * chunk
        return [
            jax.lax.dynamic_update_slice_in_dim(
                x,
                jnp.take(
                    jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=2),
                    rows,
                    axis=0,
                    mode='clip',  # rows are in range: no out-of-range masking needed
                ),
                start,
                axis=2,
            )
            for x in kv
        ]

    num_chunks = (written + chunk - 1) // chunk
    kv = jax.lax.fori_loop(0, num_chunks, reorder_chunk, [leaves[i] for i in kv_leaves])
    for i, x in zip(kv_leaves, kv, strict=True):
        leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves)


class _BeamState(NamedTuple):
    step: Array  # tokens in every alive hypothesis so far
    alive_seqs: Array  # [B, K, T] hypotheses without EOS yet, 0 from `step` on
    alive_log_probs: Array  # [B, K], sorted best first; -inf = empty slot
    finished_seqs: Array  # [B, K, T] hypotheses ending in EOS
    finished_scores: Array  # [B, K] log-prob / length penalty, sorted best first; -inf = empty
    cache: Cache  # rows b*K + k follow alive_seqs[b, k]


_BEAM_STATIC = (
    'model',
    'beam_size',
    'alpha',
    'max_decode_len',
    'extra_length',
    'early_stop',
    'ensemble',
)


@functools.partial(jax.jit, static_argnames=_BEAM_STATIC)
def _beam_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    beam_size: int,
    alpha: float,
    max_decode_len: int | None,
    extra_length: int,
    early_stop: bool,
    ensemble: bool,
) -> tuple[Array, Array, Array]:
    """`beam_search`'s sequences and scores, and the number of steps it ran."""
    batch, width = inputs.shape
    loop_length = decode_length(width, max_decode_len, extra_length)
    limits = output_limits(inputs, loop_length, extra_length)
    max_penalty = length_penalty(limits, alpha)  # [B]
    cache_length = -(-loop_length // CACHE_CHUNKS) * CACHE_CHUNKS  # `_reorder_cache`'s chunks
    # An example's encoder keys/values are projected and stored once: its K beams' query rows
    # attend to that copy (`attention._one_query`). The rest is repeated K times.
    encoded, cache = encode_and_cache(model, params, inputs, cache_length, ensemble)

    def per_beam(path, x):
        if not x.ndim or getattr(path[-1], 'key', None) in STATIC_CACHE_NAMES:
            return x
        return jnp.repeat(x, beam_size, axis=0)

    cache = map_cache(lambda c: jax.tree_util.tree_map_with_path(per_beam, c), cache, ensemble)
    beam_inputs = jnp.repeat(inputs, beam_size, axis=0)
    beam_limits = jnp.repeat(limits, beam_size)
    row_offsets = jnp.arange(batch)[:, None] * beam_size

    def not_done(state: _BeamState) -> Array:
        if not early_stop:
            return state.step < loop_length
        # Log-probs only fall as tokens are added, so an alive hypothesis can at best keep
        # its log-prob and divide it by the largest penalty still reachable (the limit's for
        # alpha >= 0). Stop once the worst of the K finished beats that for every example:
        # then no finished hypothesis can be displaced any more.
        best_penalty = jnp.maximum(length_penalty(state.step + 1, alpha), max_penalty)
        best_alive = state.alive_log_probs[:, 0] / best_penalty
        done = state.finished_scores[:, -1] >= best_alive
        return (state.step < loop_length) & ~jnp.all(done)

    def decode_step(state: _BeamState) -> _BeamState:
        step = state.step
        last_tokens = jnp.where(
            step > 0,
            jax.lax.dynamic_index_in_dim(
                state.alive_seqs, jnp.maximum(step - 1, 0), axis=2, keepdims=False
            ),
            PAD_ID,
        )
        # Steps never read `encoded`: its keys/values are cached.
        step_args = (model, params, state.cache, encoded, beam_inputs, last_tokens.reshape(-1))
        if ensemble:
            log_probs, cache = ensemble_log_probs(*step_args)
        else:
            logits, cache = step_logits(*step_args)
            log_probs = jax.nn.log_softmax(logits)
        log_probs = forbid(log_probs, step + 1 >= beam_limits)
        log_probs = state.alive_log_probs[:, :, None] + log_probs.reshape(batch, beam_size, -1)
        vocab = log_probs.shape[-1]

        # Every alive hypothesis + EOS is a candidate for the finished set (not just those
        # among the top candidates), so no short hypothesis is lost to a crowded beam.
        eos_seqs = state.alive_seqs.at[:, :, step].set(EOS_ID)
        eos_scores = log_probs[:, :, EOS_ID] / length_penalty(step + 1, alpha)
        finished_scores, order = jax.lax.top_k(
            jnp.concatenate([state.finished_scores, eos_scores], axis=1), beam_size
        )
        finished_seqs = jnp.take_along_axis(
            jnp.concatenate([state.finished_seqs, eos_seqs], axis=1), order[:, :, None], axis=1
        )

        # The K best continuations that do not end here stay alive.
        continuing = log_probs.at[:, :, EOS_ID].set(-jnp.inf).reshape(batch, beam_size * vocab)
        alive_log_probs, flat = top_k(continuing, beam_size)
        parents, tokens = flat // vocab, flat % vocab
        alive_seqs = jnp.take_along_axis(state.alive_seqs, parents[:, :, None], axis=1)
        alive_seqs = alive_seqs.at[:, :, step].set(tokens.astype(jnp.int32))
        rows = (row_offsets + parents).reshape(-1)
        written = step + 1
        cache = map_cache(lambda c: _reorder_cache(c, rows, written, cache_length), cache, ensemble)
        return _BeamState(
            step + 1, alive_seqs, alive_log_probs, finished_seqs, finished_scores, cache
        )

    alive_log_probs = jnp.full((batch, beam_size), -jnp.inf).at[:, 0].set(0.0)
    state = _BeamState(
        step=jnp.array(0, jnp.int32),
        alive_seqs=jnp.zeros((batch, beam_size, loop_length), jnp.int32),
        # All K beams start identical; only the first may expand, or the K copies would fill
        # the beam with the same hypothesis.
        alive_log_probs=alive_log_probs,
        finished_seqs=jnp.zeros((batch, beam_size, loop_length), jnp.int32),
        finished_scores=jnp.full((batch, beam_size), -jnp.inf),
        cache=cache,
    )
    state = jax.lax.while_loop(not_done, decode_step, state)
    # Slots no hypothesis reached (tiny vocabularies) hold no sequence.
    finished_seqs = jnp.where(
        jnp.isfinite(state.finished_scores)[:, :, None], state.finished_seqs, PAD_ID
    )
    return finished_seqs, state.finished_scores, state.step


def beam_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_decode_len: int | None = None,
    extra_length: int = 50,
    early_stop: bool = True,
    ensemble: bool = False,
) -> tuple[Array, Array]:
    """Beam search with the paper's settings: beam 4, alpha 0.6, input length + 50 (Sec. 6.1).

    Each step extends the K alive hypotheses of every example by every token, offers each
    hypothesis + EOS to the K-best finished set, and keeps the K most probable other
    extensions alive; the cache rows follow their hypotheses (`_reorder_cache`).

    Args:
      model: the Transformer (static: compiled once per model, static argument and shape).
      params: its parameters.
      inputs: right-padded source tokens [B, S] int32.
      beam_size: K.
      alpha: length penalty exponent, score = log P(y) / ((5 + |y|) / 6)^alpha with |y|
        counting EOS (GNMT, Wu et al., 2016).
      max_decode_len: loop length T; defaults to S + extra_length.
      extra_length: output length limit = input length + this, EOS included (Sec. 6.1).
      early_stop: end as soon as, for every example, the worst of the K finished scores is
        at least the best score any alive hypothesis could still reach; the result is the
        same as without it.
      ensemble: ``params`` are M models (`ensemble_params`), searched by the mean of
        their next-token probabilities.

    Returns:
      (sequences [B, K, T] int32, scores [B, K] float32), sorted best first. Sequences end in
      EOS and are 0 after it. A slot with score -inf holds no hypothesis (only possible when
      fewer than K sequences exist).
    """
    sequences, scores, _ = _beam_search(
        model,
        params,
        inputs,
        beam_size=beam_size,
        alpha=alpha,
        max_decode_len=max_decode_len,
        extra_length=extra_length,
        early_stop=early_stop,
        ensemble=ensemble,
    )
    return sequences, scores
