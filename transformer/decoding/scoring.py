"""The model's score of given translations (fairseq's ``--score-reference``, t5x's
``score_batch``): log P(target | source) by teacher forcing, for reranking, noisy-channel
decoding and corpus filtering.

Sources and targets are tokenized exactly as training tokenizes them (each side's
pretokenization, then EOS), never cut; an empty target is scored on its EOS alone. A pair's
log-probability sums the model's log-probabilities of the target's tokens, EOS included (the
model's own log_softmax over all of V, as the searches' scores), and its score divides that by
the run's length penalty of the token count (`next_token.length_penalty`), so a hypothesis
beam search found scores here as beam search scored it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer import data as data_lib
from transformer.decoding.mesh import DecodeLayout, decode
from transformer.decoding.next_token import Ensemble, length_penalty
from transformer.decoding.options import DecodeOptions
from transformer.model import Transformer, teacher_forced_logits

Array = jax.Array


class PairScore(NamedTuple):
    """The model's score of one (source, target) pair."""

    score: float  # log_prob / length_penalty(tokens)
    log_prob: float  # log P(target | source), EOS included
    tokens: int  # the target's tokens, EOS included
    token_log_probs: tuple[float, ...]  # each token's log-probability, EOS last


@functools.partial(jax.jit, static_argnames=('model',))
def token_log_probs(model: Transformer, params: Any, inputs: Array, targets: Array) -> Array:
    """[B, T] each target token's log-probability given the source and the tokens before it
    (the first given the decoder's start token; 0 at padding); for an `Ensemble`, the log of
    the members' mean probability."""
    members = params.members if isinstance(params, Ensemble) else (params,)
    log_probs = [
        jax.nn.log_softmax(teacher_forced_logits(model, p, inputs, targets).astype(jnp.float32))
        for p in members
    ]
    mixed = jax.nn.logsumexp(jnp.stack(log_probs), axis=0) - jnp.log(len(members))
    picked = jnp.take_along_axis(mixed, targets[..., None], axis=-1)[..., 0]
    return jnp.where(targets != model.config.special.pad, picked, 0.0)


def _encode(
    tokenizer: data_lib.Tokenizer, texts: Sequence[str], side: str, first: tuple[int, ...] = ()
) -> list[np.ndarray]:
    ids = tokenizer.encode_batch(list(texts), side) if texts else []
    return [np.array([*first, *row, tokenizer.special.eos], np.int32) for row in ids]


def score_pairs(
    model: Transformer,
    params: Any,
    tokenizer: data_lib.Tokenizer,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    options: DecodeOptions,
    batch_size: int,
    layout: DecodeLayout | None = None,
) -> list[PairScore]:
    """The `PairScore` of each pair, in their order.

    Args:
      model: the Transformer.
      params: its parameters, or an `Ensemble`.
      tokenizer: the run's vocabulary.
      sources: source sentences.
      targets: their translations, one each.
      options: the length penalty (``alpha``, ``length_penalty``) and the ``forced`` first
        ids, which each target starts with: they count in its log-probability and its
        tokens, as a teacher-forced loss counts them (`DecodeOptions`).
      batch_size: pairs per batch (batches are sorted by length and bucketed, as evaluation
        batches, so that a few shapes compile).
      layout: the mesh and processes to score on (`mesh.decode`: each batch's pairs split
        over them); None: one device.

    Raises:
      ValueError: a different number of sources and targets (before anything runs).
    """
    if len(sources) != len(targets):
        raise ValueError(f'{len(targets)} targets for {len(sources)} sources: give one a source.')
    options.penalty()  # bad ones: one line before anything runs
    if not sources:
        return []
    forced = options.forced
    pairs = _encode(tokenizer, sources, 'source'), _encode(tokenizer, targets, 'target', forced)
    batches = data_lib.batch_examples(*pairs, batch_size, tokenizer.special)
    outputs = []
    for batch in batches:
        rows = {'targets': batch['targets']}
        found = decode(token_log_probs, model, params, batch['inputs'], layout, row_options=rows)
        counts = (batch['targets'] != tokenizer.special.pad).sum(-1)
        sums = found.sum(-1, dtype=np.float64)
        penalties = np.asarray(
            length_penalty(np.maximum(counts, 1), options.alpha, options.length_penalty)
        )
        outputs.append(
            [
                PairScore(float(s / p), float(s), int(n), tuple(float(x) for x in row[:n]))
                for s, p, n, row in zip(sums, penalties, counts, found, strict=True)
            ]
        )
    return data_lib.restore_order(batches, outputs)


def format_scores(scores: Sequence[PairScore], token_scores: bool = False) -> str:
    """One line a pair, tab-separated: score, log_prob, tokens[, the tokens' log-probs
    separated by spaces]."""
    lines = []
    for s in scores:
        line = f'{s.score:.6f}\t{s.log_prob:.6f}\t{s.tokens}'
        if token_scores:
            line += '\t' + ' '.join(f'{x:.6f}' for x in s.token_log_probs)
        lines.append(line + '\n')
    return ''.join(lines)
