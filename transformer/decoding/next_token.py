"""What greedy and beam search share: one cached decoder step and what is done to its output.

The step feeds one token per sequence and returns next-token logits; an ensemble's step
mixes its members' distributions; the output-length limits, forbidden tokens and the length
penalty follow the conventions written in `transformer.decoding`'s docstring.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from absl import logging
from flax import struct

from transformer import backends
from transformer.decoding.options import (
    DEFAULT_OPTIONS,
    DecodeOptions,
    penalty_alpha,
    penalty_rule,
)
from transformer.model import (
    STACKED_KEYS,
    Transformer,
    decode_step,
    encode,
    init_cache,
)
from transformer.schema import LENGTH_PENALTIES
from transformer.tokens import SpecialIds

__all__ = ['penalty_alpha', 'penalty_rule']  # the length penalty's checks, with its formula

Array = jax.Array
Params = Any
Cache = Any


def length_penalty(length: Array | int, alpha: float | Array, rule: str | Array = 'gnmt') -> Array:
    """The divisor of a hypothesis' log-probability in beam search (``eval.length_penalty``).

    * 'gnmt': ((5 + |y|) / 6)^alpha (Wu et al., 2016, Sec. 7; the paper's alpha 0.6, Sec. 6.1).
    * 'fairseq': |y|^alpha, fairseq's ``--lenpen`` (default 1): its sequence_generator
      divides a finished hypothesis' summed log-probability by (step + 1)^lenpen, step + 1
      being the tokens generated, EOS included (the start token is not generated).
      Hugging Face's ``length_penalty`` and CTranslate2's divide by length^alpha too.

    Both are base^alpha; the rule picks the base with a select, not a Python branch, so
    ``alpha`` and ``rule`` may be traced values of one compiled search (a new setting
    recompiles nothing). The result is the same bits as the rule's own formula.

    Args:
      length: |y|, the output tokens, EOS included and the start token not, in both rules
        (beam search finishes a hypothesis at step t, counted from 0, with |y| = t + 1).
      alpha: the exponent; 0 turns either penalty off.
      rule: 'gnmt' or 'fairseq' (`schema.LENGTH_PENALTIES`), or its number (`penalty_rule`).
    """
    if isinstance(rule, str):
        rule = penalty_rule(rule)
    length = jnp.asarray(length, jnp.float32)
    fairseq = rule == LENGTH_PENALTIES.index('fairseq')
    return jnp.where(fairseq, length, (5.0 + length) / 6.0) ** alpha


def length_power(alpha: float, rule: str) -> float:
    """The exponent of a length^x penalty (Hugging Face's ``length_penalty``, fairseq's
    ``--lenpen``) that stands for ``rule`` with ``alpha``: alpha itself.

    Exact for 'fairseq', and for either rule at alpha 0. GNMT's ((5 + L) / 6)^alpha has no
    length^x equivalent (its slope in log L, alpha * L / (5 + L), tends to alpha only for long
    outputs): a one-line warning says that a decoder given the exponent ranks hypotheses
    differently.
    """
    penalty_rule(rule)  # a bad rule: the same one-line error as the searches'
    if rule == 'gnmt' and alpha:
        logging.warning(
            "eval.length_penalty='gnmt' has no length^x form: written as length_penalty=%g, "
            'which divides by length^%g, not ((5 + length) / 6)^%g, so beam search there may '
            "choose other translations (a run with eval.length_penalty='fairseq' exports exactly).",
            *(alpha, alpha, alpha),
        )
    return float(alpha)


def output_limits(inputs: Array, loop_length: int, extra_length: int, pad: int) -> Array:
    """[B] most output tokens (EOS included) each example may produce (its source's tokens
    that are not ``pad``, plus ``extra_length``)."""
    input_lengths = jnp.sum(inputs != pad, axis=-1, dtype=jnp.int32)
    return jnp.minimum(input_lengths + extra_length, loop_length)


@struct.dataclass
class Ensemble:
    """M models of one architecture decoded together, given to the searches as their
    ``params`` (`ensemble_params`); a single model's parameters are a plain tree.

    Each member encodes the source, keeps its own cache and runs the single model's step on
    its own tree; the next-token distribution is the mean of the members' probabilities,
    log(sum_m P_m / M), as fairseq's ensembles decode. (Members stacked on a new leading axis
    and mapped with ``jax.vmap`` would make every product a batched one and the cache's
    chunked writes a select over all chunks.)
    """

    members: tuple[Params, ...]

    def encode_and_cache(self, model: Transformer, inputs: Array, length: int):
        encoded, caches = zip(
            *(_encode_and_cache(model, p, inputs, length) for p in self.members), strict=True
        )
        return tuple(encoded), tuple(caches)

    def next_log_probs(self, model, cache, encoded, inputs, last_tokens, cache_mask):
        log_probs, caches = [], []
        for params, member_cache, member_encoded in zip(self.members, cache, encoded, strict=True):
            logits, member_cache = decode_step(
                model, params, member_cache, member_encoded, inputs, last_tokens, cache_mask
            )
            log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32)))
            caches.append(member_cache)
        mean = jax.nn.logsumexp(jnp.stack(log_probs), axis=0) - jnp.log(len(caches))
        return mean, tuple(caches)


def ensemble_params(trees: list[Params]) -> Ensemble:
    """Parameter trees of M models with one architecture, decoded together as ``params``."""
    if not trees:
        raise ValueError('An ensemble needs at least one model.')
    return Ensemble(tuple(trees))


def map_cache(fn, cache: Cache, params: Params) -> Cache:
    """``fn(cache)``; for an ensemble's tuple of member caches, ``fn`` of each."""
    return tuple(fn(c) for c in cache) if isinstance(params, Ensemble) else fn(cache)


def _encode_and_cache(model: Transformer, params: Params, inputs: Array, length: int):
    encoded = encode(model, params, inputs)
    return encoded, init_cache(model, params, encoded, inputs, length)


def encode_and_cache(
    model: Transformer, params: Params, inputs: Array, length: int
) -> tuple[Array, Cache]:
    """The encoder output and a decoding cache of ``length`` positions (for an `Ensemble`,
    a tuple of each, one per member)."""
    if isinstance(params, Ensemble):
        return params.encode_and_cache(model, inputs, length)
    return _encode_and_cache(model, params, inputs, length)


def next_scores(
    model: Transformer,
    params: Params,
    cache: Cache,
    encoded: Array,
    inputs: Array,
    last_tokens: Array,
    cache_mask: Array | None = None,
    *,
    normalized: bool,
) -> tuple[Array, Cache]:
    """One cached step of the model or `Ensemble`: next-token scores [B', V] and the updated
    cache. The scores are log-probabilities; with ``normalized=False`` a single model's are
    its logits, which rank the tokens the same (greedy's argmax needs no normalisation)."""
    if isinstance(params, Ensemble):
        return params.next_log_probs(model, cache, encoded, inputs, last_tokens, cache_mask)
    logits, cache = decode_step(model, params, cache, encoded, inputs, last_tokens, cache_mask)
    return (jax.nn.log_softmax(logits) if normalized else logits), cache


def top_k(x: Array, k: int, block: int = 128) -> tuple[Array, Array]:
    """``jax.lax.top_k(x, k)`` over the last axis of a 2-D ``x``: the same values and indices,
    ties to the lower index, in two small passes.

    XLA's CPU top-k is slow on wide rows such as beam search's [B, K*V] candidates
    (benchmarks/README.md, decode_speed.py). The k best entries lie in at most k blocks of
    ``block`` entries: those with the k best block maxima (by value, then lower block). One
    max per block, a top-k over the block maxima, and a top-k over the k chosen blocks (kept
    in index order, so ties still go to the lower index) give the same result.
    """
    rows, width = x.shape
    if width <= 2 * k * block:
        return jax.lax.top_k(x, k)
    num_blocks = -(-width // block)
    pad = num_blocks * block - width  # -inf after every real entry: never preferred to one
    blocks = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf).reshape(rows, -1, block)
    _, chosen = jax.lax.top_k(blocks.max(axis=-1), k)
    chosen = jnp.sort(chosen, axis=-1)  # [rows, k] block numbers in index order
    candidates = jnp.take_along_axis(blocks, chosen[:, :, None], axis=1).reshape(rows, -1)
    values, where = jax.lax.top_k(candidates, k)
    indices = jnp.take_along_axis(chosen, where // block, axis=-1) * block + where % block
    return values, indices


def forbid(
    scores: Array, at_limit: Array, special: SpecialIds, options: DecodeOptions = DEFAULT_OPTIONS
) -> Array:
    """``scores`` [B', V] with impossible tokens at -inf.

    ``at_limit`` [B'] marks sequences whose next token is their last allowed one: only EOS
    (``special.eos``) stays possible there, unless ``options.eos_at_limit`` is 'none' (at
    log-probability 0 when 'forced'). The ids ``options`` bans (`DecodeOptions.banned`: the
    vocabulary's ``never_emit``, padding always) are never possible.
    """
    vocab = jnp.arange(scores.shape[-1])
    never = jnp.isin(vocab, jnp.asarray(options.banned(special), jnp.int32))
    if options.eos_at_limit == 'none':
        return jnp.where(never, -jnp.inf, scores)
    forbidden = never | (at_limit[:, None] & (vocab != special.eos))
    scores = jnp.where(forbidden, -jnp.inf, scores)
    if options.eos_at_limit == 'forced':
        scores = jnp.where(at_limit[:, None] & (vocab == special.eos), 0.0, scores)
    return scores


def stage_sizes(batch: int, min_stage_batch: int) -> list[int]:
    """Batch sizes a search with early stopping runs at (`shrinking_loop`): B, then B/2 and B/4
    while those are whole and at least ``min_stage_batch``; B alone where staging does not
    pay (`backends.staged_search`). Under a mesh (transformer/decoding/mesh.py) every size is
    also a multiple of its ``data`` axis, so each stage's rows still split evenly over it."""
    sizes = [batch]
    if not backends.staged_search():
        return sizes
    shards = jax.sharding.get_abstract_mesh().shape.get('data', 1)
    while len(sizes) < 3 and sizes[-1] % (2 * shards) == 0 and sizes[-1] // 2 >= min_stage_batch:
        sizes.append(sizes[-1] // 2)
    return sizes


def take_examples(tree: Any, index: Array, batch: int) -> Any:
    """The rows of examples ``index`` (into ``batch``) from every array in ``tree`` whose
    leading axis is B or a multiple of it (K rows per example, e.g. B*K beams); scalars (the
    step, the cache's positions: the same for every example) stay."""

    def take(x):
        if not x.ndim:
            return x
        rows = x.reshape(batch, -1, *x.shape[1:])  # [B*K, ...] -> [B, K, ...]
        return rows[index].reshape(-1, *x.shape[1:])

    return _per_layer(take, tree)


def _per_layer(fn, tree: Any) -> Any:
    """``fn`` of every array of ``tree``; an array of a scanned model's stacked layers
    (transformer/model/layer_stack.py: below ``decoder_layers``, its layer axis first) is
    taken layer by layer, so that its rows axis is the one ``fn`` sees."""

    def each(path, x):
        if not any(getattr(key, 'key', None) in STACKED_KEYS for key in path):
            return fn(x)
        return jax.vmap(fn)(x) if x.ndim > 1 else x  # [L]: one position a layer, the same

    return jax.tree_util.tree_map_with_path(each, tree)


def split_rows(tree: Any) -> Any:
    """``tree`` with every array's leading (rows) axis kept split over the ``data`` axis of
    the mesh being decoded on (transformer/decoding/mesh.py), its other axes as XLA places
    them; unchanged off a mesh. Without it the rows a stage of `shrinking_loop` gathers are
    replicated: every device would decode every remaining row."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get('data', 1) == 1:
        return tree

    def split(x):
        if not x.ndim:
            return x
        spec = jax.sharding.PartitionSpec(
            'data', *[jax.sharding.PartitionSpec.UNCONSTRAINED] * (x.ndim - 1)
        )
        return jax.lax.with_sharding_constraint(x, spec)

    return _per_layer(split, tree)


def shrinking_loop(step, state, *, more_steps, searching, sizes, outputs):
    """``state = step(state)`` while ``more_steps(state)`` and an example is still
    ``searching``, on a batch that shrinks as its examples finish.

    A search's examples end at different steps, and until the last one has, a batch of B runs
    every step on all B. Here, once at most ``sizes[1]`` examples are still searching, the
    loop goes on with only those (topped up with finished ones) in a batch of ``sizes[1]``,
    and so on down ``sizes`` (`stage_sizes`); a finished example's ``outputs`` must not change
    any more, so they are kept aside as they are. Each size is a loop of its own in the
    compiled program.

    Args:
      step: one search step, state -> state.
      state: the search state; every array with a leading axis has B (or B*K) rows.
      more_steps: state -> scalar bool, False once the search must end for all examples.
      searching: state -> [B] bool, False for the examples whose outputs are final.
      sizes: the batch sizes, ``sizes[0]`` = B.
      outputs: state -> the arrays to return, each [B, ...].

    Returns:
      (the last state, ``outputs`` of all B examples in their order).
    """
    full = outputs(state)
    where = jnp.arange(sizes[0])  # the example of each row of the current batch
    for next_size in [*sizes[1:], 0]:

        def not_done(state, next_size=next_size):
            return more_steps(state) & (jnp.sum(searching(state)) > next_size)

        state = jax.lax.while_loop(not_done, step, state)
        full = jax.tree_util.tree_map(lambda f, x, w=where: f.at[w].set(x), full, outputs(state))
        if next_size:  # the examples still searching first, in their order
            keep = jnp.argsort(~searching(state), stable=True)[:next_size]
            state, where = take_examples(state, keep, len(where)), where[keep]
            state = split_rows(state)
    return state, full
