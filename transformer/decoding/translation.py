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

from transformer import data as data_lib
from transformer.decoding.beam import beam_search
from transformer.decoding.mesh import DecodeLayout, decode
from transformer.decoding.next_token import length_penalty, penalty_alpha
from transformer.decoding.search import translate_batch
from transformer.model import Transformer
from transformer.tokens import EOS_ID


def translate_batches(
    model: Transformer,
    params: Any,
    tokenizer: data_lib.Tokenizer,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    beam_size: int,
    alpha: float,
    extra_length: int,
    length_penalty: str = 'gnmt',
    layout: DecodeLayout | None = None,
) -> list[str]:
    """Detokenized best hypotheses of evaluation batches, in the original example order
    (``params`` may be an `Ensemble`: models decoded together, `ensemble.load_ensemble`);
    with a ``layout``, each batch's rows are split over its mesh and processes
    (`mesh.decode`) and every process returns every hypothesis."""
    outputs = []
    for i, batch in enumerate(batches):
        tokens = decode(
            translate_batch,
            model,
            params,
            batch['inputs'],
            layout,
            beam_size=beam_size,
            alpha=alpha,
            length_penalty=length_penalty,
            extra_length=extra_length,
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


def sequence_log_probs(
    sequences: np.ndarray, scores: np.ndarray, alpha: float, rule: str = 'gnmt'
) -> np.ndarray:
    """log P(y|x) of beam search's hypotheses [..., T] from their scores [...]: the score
    times the length penalty (``rule``, `length_penalty`) of |y| (EOS included); -inf where
    the score is -inf."""
    lengths = np.argmax(sequences == EOS_ID, axis=-1) + 1
    penalty = np.asarray(length_penalty(lengths, alpha, rule))
    with np.errstate(invalid='ignore'):
        return np.where(np.isfinite(scores), scores * penalty, -np.inf)


def nbest_batches(
    model: Transformer,
    params: Any,
    tokenizer: data_lib.Tokenizer,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    nbest: int,
    beam_size: int,
    alpha: float,
    extra_length: int,
    length_penalty: str = 'gnmt',
    layout: DecodeLayout | None = None,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of every example (beam of max(beam_size, nbest)), best
    first, in the original example order (on ``layout``'s mesh as `translate_batches`)."""
    outputs = []
    for batch in batches:
        sequences, scores = decode(
            beam_search,
            model,
            params,
            batch['inputs'],
            layout,
            beam_size=max(beam_size, nbest),
            alpha=alpha,
            length_penalty=length_penalty,
            extra_length=extra_length,
        )
        log_probs = sequence_log_probs(sequences, scores, alpha, length_penalty)
        outputs.append(
            [
                [
                    Hypothesis(
                        ' '.join(tokenizer.decode(seq.tolist()).split()), float(s), float(lp)
                    )
                    for seq, s, lp in zip(seqs[:nbest], row[:nbest], lps[:nbest], strict=True)
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
        sources.append(np.array([*ids, EOS_ID], np.int32))
    return todo, sources


def translate_lines(
    lines: Sequence[str],
    tokenizer: data_lib.Tokenizer,
    model: Transformer,
    params: Any,
    *,
    beam_size: int,
    alpha: float,
    extra_length: int,
    batch_size: int,
    max_input_tokens: int,
    nbest: int = 0,
    length_penalty: str = 'gnmt',
    layout: DecodeLayout | None = None,
) -> list[str] | list[list[Hypothesis]]:
    """Translations of ``lines``, aligned with them ('' for blank lines), or with ``nbest``
    K > 0 the K best `Hypothesis` of each line ([] for blank lines).

    Args:
      lines: source sentences (no trailing newlines).
      tokenizer: the run's vocabulary.
      model: the Transformer.
      params: its parameters.
      beam_size: 1 = greedy.
      alpha: the length penalty's exponent.
      extra_length: output may be this many tokens longer than its input (Sec. 6.1).
      batch_size: sentences per decoding batch.
      max_input_tokens: longer inputs are cut to this many tokens (EOS included).
      nbest: 0 = one translation per line; K > 0 = the K best hypotheses of each (beam search
        with max(beam_size, K) beams).
      length_penalty: its rule, 'gnmt' or 'fairseq' (`next_token.length_penalty`).
      layout: the mesh and processes to decode on (`mesh.DecodeLayout`); None: one device.

    Returns:
      One translation (or list of hypotheses) per line.
    """
    penalty_alpha(alpha)  # refused before anything is decoded, greedy included
    todo, sources = _encode_lines(lines, tokenizer, max_input_tokens)
    out: list = [[] for _ in lines] if nbest else [''] * len(lines)
    if not sources:
        return out
    batches = data_lib.batch_examples(sources, None, batch_size)
    search = dict(
        alpha=alpha, extra_length=extra_length, length_penalty=length_penalty, layout=layout
    )
    if nbest:
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
