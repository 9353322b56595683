"""Which search a caller gets: the best output of greedy or beam search, by the beam size, or
a sample; and the N outputs of each input an n-best list holds (beam search's N best, or N
samples)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from transformer.decoding.beam import beam_search
from transformer.decoding.constraints import Constraints
from transformer.decoding.greedy import greedy_search
from transformer.decoding.mesh import DecodeLayout, decode
from transformer.decoding.next_token import DEFAULT_RULES, StepRules
from transformer.decoding.next_token import length_penalty as penalty
from transformer.decoding.sampling import Sampling, sample_search
from transformer.model import Transformer
from transformer.tokens import JOINT

Array = jax.Array
Params = Any


def translate_batch(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    length_penalty: str = 'gnmt',
    max_decode_len: int | None = None,
    extra_length: int = 50,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    prefixes: Array | None = None,
    line_indices: Array | None = None,
    rules: StepRules = DEFAULT_RULES,
) -> Array:
    """Best output tokens [B, T]: greedy search for ``beam_size == 1``, else beam search; with
    ``sampling``, the first sample of each input (``beam_size`` unused).

    Greedy is not beam search with one beam: that one would still weigh every EOS on its
    path by the length penalty, and here beam 1 means the cheaper plain greedy decode.
    ``constraints`` and ``prefixes`` [B, P] go to whichever search runs, ``rules``
    (`next_token.StepRules`) to greedy and beam search; ``line_indices`` [B] seed the
    samples (`sampling.sample_search`).
    """
    limits = dict(max_decode_len=max_decode_len, extra_length=extra_length)
    controls = dict(constraints=constraints, prefixes=prefixes)
    if sampling is not None:
        sequences, _ = sample_search(
            model, params, inputs, sampling=sampling, line_indices=line_indices,
            **limits, **controls,
        )  # fmt: skip
        return sequences[:, 0]
    if beam_size == 1:
        return greedy_search(model, params, inputs, **limits, **controls, rules=rules)
    sequences, _ = beam_search(
        model,
        params,
        inputs,
        beam_size=beam_size,
        alpha=alpha,
        length_penalty=length_penalty,
        **limits,
        **controls,
        rules=rules,
    )
    return sequences[:, 0]


def sequence_log_probs(
    sequences: np.ndarray,
    scores: np.ndarray,
    alpha: float,
    rule: str = 'gnmt',
    eos: int = JOINT.eos,
    pad: int = JOINT.pad,
) -> np.ndarray:
    """log P(y|x) of beam search's hypotheses [..., T] from their scores [...]: the score
    times the length penalty (``rule``, `length_penalty`) of |y| (up to ``eos``, the
    vocabulary's, included; a hypothesis that ended at its limit without EOS: its tokens
    that are not ``pad``); -inf where the score is -inf."""
    ended = (sequences == eos).any(axis=-1)
    lengths = np.where(
        ended, np.argmax(sequences == eos, axis=-1) + 1, np.sum(sequences != pad, axis=-1)
    )
    scale = np.asarray(penalty(lengths, alpha, rule))
    with np.errstate(invalid='ignore'):
        return np.where(np.isfinite(scores), scores * scale, -np.inf)


def hypotheses_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    nbest: int,
    beam_size: int,
    alpha: float,
    length_penalty: str,
    extra_length: int,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    prefixes: Array | None = None,
    line_indices: Array | None = None,
    rules: StepRules = DEFAULT_RULES,
) -> tuple[Array, Array]:
    """(sequences [B, N, T], values [B, N]) on the devices: with ``sampling`` its
    ``num_samples`` samples in sample order and their log P(y|x), else the ``nbest`` best of
    beam search with max(beam_size, nbest) beams and their scores."""
    controls = dict(constraints=constraints, prefixes=prefixes, extra_length=extra_length)
    if sampling is not None:
        return sample_search(
            model, params, inputs, sampling=sampling, line_indices=line_indices, **controls
        )
    sequences, scores = beam_search(
        model,
        params,
        inputs,
        beam_size=max(beam_size, nbest),
        alpha=alpha,
        length_penalty=length_penalty,
        **controls,
        rules=rules,
    )
    return sequences[:, :nbest], scores[:, :nbest]


def hypotheses_batch(
    model: Transformer,
    params: Params,
    inputs: np.ndarray,
    *,
    nbest: int,
    beam_size: int,
    alpha: float,
    length_penalty: str,
    extra_length: int,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    prefixes: np.ndarray | None = None,
    line_indices: np.ndarray | None = None,
    layout: DecodeLayout | None = None,
    rules: StepRules = DEFAULT_RULES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequences [B, N, T], scores [B, N], log_probs [B, N]) as numpy arrays of
    `hypotheses_search`, run on ``layout``'s mesh (`mesh.decode`; one device without it). A
    score is log P(y|x) / length_penalty(|y|)."""
    per_row = {'prefixes': prefixes, 'line_indices': line_indices}
    sequences, values = decode(
        hypotheses_search,
        model,
        params,
        inputs,
        layout,
        row_options={key: value for key, value in per_row.items() if value is not None},
        nbest=nbest,
        beam_size=beam_size,
        alpha=alpha,
        length_penalty=length_penalty,
        extra_length=extra_length,
        sampling=sampling,
        constraints=constraints,
        rules=rules,
    )
    eos, pad = model.config.special.eos, model.config.special.pad
    if sampling is not None:
        lengths = np.argmax(sequences == eos, axis=-1) + 1
        return sequences, values / np.asarray(penalty(lengths, alpha, length_penalty)), values
    log_probs = sequence_log_probs(sequences, values, alpha, length_penalty, eos, pad)
    return sequences, values, log_probs
