"""Lines of text in, translations out (or n-best lists): what the translate command
(transformer/commands/translate.py) and evaluation decode with.

Output line i is the translation of input line i: empty (or blank) lines stay empty, and a line
longer than ``--max_input_tokens`` tokens is cut to that length (with a warning on stderr)
rather than failing the run. Input is read as bytes and split at ``\n`` only; CRLF line ends
are accepted, invalid UTF-8 becomes U+FFFD and control characters spaces, each with a warning
naming the line (transformer/data/text.py). Progress and warnings go to stderr,
translations to stdout.

``--nbest K`` writes the K best beam-search hypotheses of every non-blank input line instead,
best first, one a line, tab-separated (as Moses and fairseq n-best lists, line numbers from 0):

    line_index  rank (1 = best)  score  log_prob  text

``score`` is what beam search ranks by, log P(y|x) / length_penalty(|y|) (the rule of
``--length_penalty``, GNMT's ((5 + |y|) / 6)^alpha or fairseq's |y|^alpha, with ``--alpha``);
``log_prob`` is log P(y|x) itself, recovered as score x penalty (|y| counts EOS) without
another pass of the model. Blank input lines have no rows; an input
with fewer than K distinct hypotheses (tiny vocabularies) has fewer rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from absl import logging

from transformer import backends
from transformer import data as data_lib
from transformer.decoding.constraints import Constraints
from transformer.decoding.mesh import DecodeLayout, decode
from transformer.decoding.options import DecodeOptions
from transformer.decoding.sampling import Sampling
from transformer.decoding.search import hypotheses_batch, sequence_log_probs, translate_batch
from transformer.model import Transformer

__all__ = ['sequence_log_probs']  # n-best's log P(y|x), here for its callers


def _batch_arguments(
    batch: dict[str, np.ndarray],
    options: DecodeOptions,
    line_indices: Sequence[int] | None,
    pad: int,
) -> dict[str, Any]:
    """A batch's search arguments: ``line_indices`` [B] (filler rows 0; the example's own
    index when none are given) and the options with the batch's rows of their per-example
    prefixes, [B, T] padded with ``pad`` to the loop length T, so that every prefix of a batch
    shape runs one compiled search."""
    index = batch['index']
    lines = index if line_indices is None else np.asarray(line_indices)[np.maximum(index, 0)]
    out: dict[str, Any] = {'line_indices': np.where(index >= 0, lines, 0).astype(np.int32)}
    prefixes = options.prefixes
    if prefixes is not None:
        rows, width = batch['inputs'].shape
        forced = np.full((rows, options.loop_length(width)), pad, np.int32)
        for row, i in enumerate(index):
            if i >= 0:
                forced[row, : len(prefixes[i])] = prefixes[i]
        options = options.with_prefixes(forced)
    out['options'] = options
    return out


def translate_batches(
    model: Transformer,
    params: Any,
    tokenizer: data_lib.Tokenizer,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    beam_size: int,
    options: DecodeOptions,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    line_indices: Sequence[int] | None = None,
    layout: DecodeLayout | None = None,
) -> list[str]:
    """Detokenized best hypotheses (with ``sampling``, samples) of evaluation batches, in the
    original example order (``params`` may be an `Ensemble`: models decoded together,
    `ensemble.load_ensemble`); with a ``layout``, each batch's rows are split over its mesh
    and processes (`mesh.decode`) and every process returns every hypothesis.

    ``options.prefixes`` (token ids, no EOS, one array an example) and ``line_indices``
    (the seed of each example's samples; default its index) are per example, indexed as the
    batches' ``index``.
    """
    outputs = []
    for i, batch in enumerate(batches):
        arguments = _batch_arguments(batch, options, line_indices, model.config.special.pad)
        tokens = decode(
            translate_batch,
            model,
            params,
            batch['inputs'],
            layout,
            row_options={'line_indices': arguments['line_indices']},
            beam_size=beam_size,
            options=arguments['options'],
            sampling=sampling,
            constraints=constraints,
        )
        outputs.append([tokenizer.decode(row.tolist()) for row in tokens])
        if (i + 1) % 10 == 0 or i + 1 == len(batches):
            logging.info('Decoded %d/%d batches.', i + 1, len(batches))
    return data_lib.restore_order(batches, outputs)


class Hypothesis(NamedTuple):
    """One entry of an n-best list."""

    text: str
    score: float  # log P(y|x) / length_penalty(|y|): what beam search ranks by
    log_prob: float  # log P(y|x)


def nbest_batches(
    model: Transformer,
    params: Any,
    tokenizer: data_lib.Tokenizer,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    nbest: int,
    beam_size: int,
    options: DecodeOptions,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    line_indices: Sequence[int] | None = None,
    layout: DecodeLayout | None = None,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of every example (beam of max(beam_size, nbest)), best
    first, or with ``sampling`` its ``num_samples`` samples in sample order; in the original
    example order. ``options``, ``line_indices`` and ``layout`` as `translate_batches`'."""
    outputs = []
    for batch in batches:
        sequences, scores, log_probs = hypotheses_batch(
            model,
            params,
            batch['inputs'],
            layout=layout,
            nbest=nbest,
            beam_size=beam_size,
            sampling=sampling,
            constraints=constraints,
            **_batch_arguments(batch, options, line_indices, model.config.special.pad),
        )
        outputs.append(
            [
                [
                    Hypothesis(_one_line(tokenizer.decode(seq.tolist())), float(s), float(lp))
                    for seq, s, lp in zip(seqs, row, lps, strict=True)
                    if np.isfinite(s)
                ]
                for seqs, row, lps in zip(sequences, scores, log_probs, strict=True)
            ]
        )
    return data_lib.restore_order(batches, outputs)


def _one_line(text: str) -> str:
    return ' '.join(text.split())  # never a newline or tab inside a translation


def format_nbest(nbest: Sequence[Sequence[Hypothesis]]) -> str:
    """``line_index\trank\tscore\tlog_prob\ttext`` rows (see the module docstring)."""
    return ''.join(
        f'{index}\t{rank}\t{h.score:.4f}\t{h.log_prob:.4f}\t{h.text}\n'
        for index, hypotheses in enumerate(nbest)
        for rank, h in enumerate(hypotheses, start=1)
    )


def _encode_lines(
    lines: Sequence[str], tokenizer: data_lib.Tokenizer, max_input_tokens: int
) -> tuple[list[int], list[np.ndarray]]:
    """(numbers of the non-blank lines, their token ids + EOS, cut to max_input_tokens)."""
    if max_input_tokens < 2:
        raise ValueError(f'max_input_tokens must be at least 2, got {max_input_tokens}.')
    todo, sources = [], []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        ids = tokenizer.encode(line.strip())
        if len(ids) + 1 > max_input_tokens:
            logging.warning(
                'Line %d has %d tokens; translating its first %d (--max_input_tokens).',
                number + 1,
                len(ids) + 1,
                max_input_tokens,
            )
            ids = ids[: max_input_tokens - 1]
        todo.append(number)
        sources.append(np.array([*ids, tokenizer.special.eos], np.int32))
    return todo, sources


def encode_prefixes(
    prefixes: Sequence[str],
    todo: Sequence[int],
    sources: Sequence[np.ndarray],
    tokenizer: data_lib.Tokenizer,
    options: DecodeOptions,
) -> list[np.ndarray]:
    """Token ids (no EOS, tokenized as a training target) of the prefixes of the lines
    ``todo``, whose sources are ``sources``; a `ValueError` naming the first line whose
    prefix, after ``options.forced``, leaves no room for EOS within its output limit (input
    length + ``options.extra_length``)."""
    encoded, extra, forced = [], options.extra_length, len(options.forced)
    for number, source in zip(todo, sources, strict=True):
        text = prefixes[number].strip()
        ids = np.array(tokenizer.encode(text, 'target') if text else [], np.int32)
        limit = len(source) + extra
        if forced + len(ids) + 1 > limit:
            held = f' after {forced} forced' if forced else ''
            raise ValueError(
                f'The prefix of line {number + 1} has {len(ids)} tokens{held}; its output may '
                f'hold {limit - 1} and EOS (input tokens + {extra}): shorten it.'
            )
        encoded.append(ids)
    return encoded


def check_options(
    lines: Sequence[str],
    sampling: Sampling | None,
    constraints: Constraints | None,
    prefixes: Sequence[str] | None,
    nbest: int,
) -> Constraints | None:
    """One `ValueError` line for settings that cannot work together, before any decoding;
    returns the constraints the searches get (None when they are off)."""
    if sampling is not None:
        sampling.check()
        if nbest:
            raise ValueError('nbest lists come from beam search; sampling draws num_samples.')
    if prefixes is not None and len(prefixes) != len(lines):
        raise ValueError(f'{len(prefixes)} prefixes for {len(lines)} lines: give one a line.')
    if constraints is not None:
        constraints.check()
    return constraints if constraints is not None and constraints.active else None


def batch_rows(lines: int, batch_size: int) -> int:
    """Rows of each decoding batch of ``lines`` sentences: ``batch_size``, or on a CPU
    (`backends.fitted_lone_batch`) for fewer lines than that the smallest power of two that
    holds them (1, 2, 4, ...: one search compiled per size)."""
    if lines >= batch_size or not backends.fitted_lone_batch():
        return batch_size
    return 1 << (lines - 1).bit_length()


def translate_lines(
    lines: Sequence[str],
    tokenizer: data_lib.Tokenizer,
    model: Transformer,
    params: Any,
    *,
    beam_size: int,
    options: DecodeOptions,
    batch_size: int,
    max_input_tokens: int,
    nbest: int = 0,
    sampling: Sampling | None = None,
    constraints: Constraints | None = None,
    prefixes: Sequence[str] | None = None,
    layout: DecodeLayout | None = None,
) -> list[str] | list[list[Hypothesis]]:
    """Translations of ``lines``, aligned with them ('' for blank lines), or with ``nbest``
    K > 0 (or ``sampling.num_samples`` > 1) the K best `Hypothesis` (the samples) of each.

    Args:
      lines: source sentences (no trailing newlines).
      tokenizer: the run's vocabulary.
      model: the Transformer.
      params: its parameters.
      beam_size: 1 = greedy.
      options: how the searches decode (`DecodeOptions`: the length limit and its rule, the
        length penalty, the forced first ids, ...).
      batch_size: sentences per decoding batch (fewer lines than that: `batch_rows`).
      max_input_tokens: longer inputs are cut to this many tokens (EOS included).
      nbest: 0 = one translation per line; K > 0 = the K best hypotheses of each (beam search
        with max(beam_size, K) beams).
      sampling: draw the outputs (`sampling.Sampling`; line i seeded by i), no beam search.
      constraints: a minimum length and n-gram blocking (`constraints.Constraints`).
      prefixes: a target prefix a line, for its output to start with after
        ``options.forced`` ('' = none).
      layout: the mesh and processes to decode on (`mesh.DecodeLayout`); None: one device.
    """
    options.penalty()  # refused before anything is decoded, greedy included
    options.check_forced(model.config.special)
    constraints = check_options(lines, sampling, constraints, prefixes, nbest)
    todo, sources = _encode_lines(lines, tokenizer, max_input_tokens)
    many = nbest or (sampling is not None and sampling.num_samples > 1)
    out: list = [[] for _ in lines] if many else [''] * len(lines)
    if not sources:
        return out
    if prefixes is not None:
        ids = encode_prefixes(prefixes, todo, sources, tokenizer, options)
        options = options.with_prefixes(ids)
    search = dict(sampling=sampling, constraints=constraints, line_indices=todo, layout=layout)
    search['options'] = options
    rows = batch_rows(len(sources), batch_size)
    batches = data_lib.batch_examples(sources, None, rows, tokenizer.special)
    if many:
        hypotheses = nbest_batches(
            model, params, tokenizer, batches, nbest=nbest, beam_size=beam_size, **search
        )
        for number, found in zip(todo, hypotheses, strict=True):
            out[number] = found
        return out
    translations = translate_batches(
        model, params, tokenizer, batches, beam_size=beam_size, **search
    )
    for number, text in zip(todo, translations, strict=True):
        out[number] = _one_line(text)
    return out
