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
from transformer.decoding.next_token import length_penalty as penalty
from transformer.decoding.options import DEFAULT_OPTIONS, DecodeOptions
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
    options: DecodeOptions = DEFAULT_OPTIONS,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    line_indices: Array | None = None,
) -> Array:
    """Best output tokens [B, T]: greedy search for ``beam_size == 1``, else beam search; with
    ``sampling``, the first sample of each input (``beam_size`` unused).

    Greedy is not beam search with one beam: that one would still weigh every EOS on its
    path by the length penalty, and here beam 1 means the cheaper plain greedy decode.
    ``options`` (`DecodeOptions`, its per-row prefixes [B, P] included) and ``constraints``
    go to whichever search runs; ``line_indices`` [B] seed the samples
    (`sampling.sample_search`).
    """
    common = dict(options=options, constraints=constraints)
    if sampling is not None:
        sequences, _ = sample_search(
            model, params, inputs, sampling=sampling, line_indices=line_indices, **common
        )
        return sequences[:, 0]
    if beam_size == 1:
        return greedy_search(model, params, inputs, **common)
    sequences, _ = beam_search(model, params, inputs, beam_size=beam_size, **common)
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
    options: DecodeOptions,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    line_indices: Array | None = None,
) -> tuple[Array, Array]:
    """(sequences [B, N, T], values [B, N]) on the devices: with ``sampling`` its
    ``num_samples`` samples in sample order and their log P(y|x), else the ``nbest`` best of
    beam search with max(beam_size, nbest) beams and their scores."""
    common = dict(options=options, constraints=constraints)
    if sampling is not None:
        return sample_search(
            model, params, inputs, sampling=sampling, line_indices=line_indices, **common
        )
    sequences, scores = beam_search(
        model, params, inputs, beam_size=max(beam_size, nbest), **common
    )
    return sequences[:, :nbest], scores[:, :nbest]


def hypotheses_batch(
    model: Transformer,
    params: Params,
    inputs: np.ndarray,
    *,
    nbest: int,
    beam_size: int,
    options: DecodeOptions,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    line_indices: np.ndarray | None = None,
    layout: DecodeLayout | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequences [B, N, T], scores [B, N], log_probs [B, N]) as numpy arrays of
    `hypotheses_search`, run on ``layout``'s mesh (`mesh.decode`; one device without it). A
    score is log P(y|x) / length_penalty(|y|)."""
    rows = {} if line_indices is None else {'line_indices': line_indices}
    sequences, values = decode(
        hypotheses_search,
        model,
        params,
        inputs,
        layout,
        row_options=rows,
        nbest=nbest,
        beam_size=beam_size,
        options=options,
        sampling=sampling,
        constraints=constraints,
    )
    eos, pad = model.config.special.eos, model.config.special.pad
    alpha, rule = options.alpha, options.length_penalty
    if sampling is not None:
        lengths = np.argmax(sequences == eos, axis=-1) + 1
        return sequences, values / np.asarray(penalty(lengths, alpha, rule)), values
    log_probs = sequence_log_probs(sequences, values, alpha, rule, eos, pad)
    return sequences, values, log_probs
