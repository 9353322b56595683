"""Evaluation batches: every example, sorted by length, bucketed, and put back in order.

Nothing is dropped or truncated: examples are sorted by length, cut into batches of a fixed
number of rows, each padded to a bucketed length (16, 32, 48, 64, 96, 128, 192, 256, ...) and
the last filled with filler rows (index -1), so XLA compiles a few shapes; ``restore_order``
maps per-row outputs back to the dataset's order. An `EvalSet` is the batches of a split
together with its raw references, built once and used for both validation loss and BLEU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer.data.sources import load_text
from transformer.data.tokenized import encode_texts, tokenize_split
from transformer.data.tokenizer import Tokenizer
from transformer.tokens import JOINT, SpecialIds


def bucket_length(n: int) -> int:
    """The smallest of 16, 32, 48, 64, 96, 128, 192, 256, 384, ... that is >= n.

    Steps of at most 1.5x keep padding at most a third, with ~2 shapes per doubling.
    """
    if n <= 16:
        return 16
    base = 32
    while True:
        if n <= base:
            return base
        if n <= base * 3 // 2:
            return base * 3 // 2
        base *= 2


def batch_examples(
    sources: Sequence[np.ndarray],
    targets: Sequence[np.ndarray] | None,
    batch_size: int,
    special: SpecialIds = JOINT,
) -> list[dict[str, np.ndarray]]:
    """Examples in length-sorted, bucketed batches of ``batch_size`` rows (see
    ``make_eval_batches``); ``targets`` None for source-only batches (translation).

    Args:
      sources: token ids of each example's source, EOS included.
      targets: the same for the targets, or None.
      batch_size: rows per batch.
      special: the vocabulary's ids: its pad fills the rows, a filler row's source is [eos].

    Returns:
      Batches with 'inputs', 'targets' (when given) and 'index'.
    """
    n = len(sources)
    source_lengths = np.array([len(x) for x in sources], np.int64)
    target_lengths = (
        np.array([len(x) for x in targets], np.int64)
        if targets is not None
        else np.zeros(n, np.int64)
    )
    order = np.argsort(np.maximum(source_lengths, target_lengths), kind='stable')
    batches = []
    for start in range(0, n, batch_size):
        index = order[start : start + batch_size]
        length = bucket_length(int(max(source_lengths[index].max(), target_lengths[index].max())))
        batch = {
            'inputs': np.full((batch_size, length), special.pad, np.int32),
            'index': np.full((batch_size,), -1, np.int32),
        }
        if targets is not None:
            batch['targets'] = np.full((batch_size, length), special.pad, np.int32)
        batch['inputs'][len(index) :, 0] = special.eos
        batch['index'][: len(index)] = index
        for row, i in enumerate(index):
            batch['inputs'][row, : len(sources[i])] = sources[i]
            if targets is not None:
                batch['targets'][row, : len(targets[i])] = targets[i]
        batches.append(batch)
    return batches


def make_eval_batches(
    data_config: Any,
    tokenizer: Tokenizer,
    split: str,
    *,
    batch_size: int,
    cache_dir: str | None = None,
    max_examples: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """Every example of a split in batches sorted by length, for evaluation and decoding.

    Nothing is dropped or truncated. Each batch holds ``batch_size`` rows: 'inputs' and
    'targets' [batch_size, L] (each example ends with EOS, padded with the pad id; L =
    bucket_length of the batch's longest side, possibly above max_len) and 'index'
    [batch_size] (the example's position in the split, -1 for filler rows). Filler rows have
    the source [EOS] (so no row is fully masked) and an all-padding target (so they weigh
    nothing in a loss).

    Args:
      data_config: the ``data`` config section.
      tokenizer: the vocabulary.
      split: the split's name.
      batch_size: rows per batch.
      cache_dir: where the token ids are cached (None: not on disk).
      max_examples: keep only the first ``max_examples`` examples of the split.

    Returns:
      The batches; see ``restore_order`` for putting outputs back in order.
    """
    data = tokenize_split(data_config, tokenizer, split, cache_dir)
    n = data.num_examples if max_examples is None else min(max_examples, data.num_examples)
    batches = batch_examples(
        [data.source(i) for i in range(n)],
        [data.target(i) for i in range(n)],
        batch_size,
        tokenizer.special,
    )
    logging.info(
        'Evaluation data %s: %d examples in %d batches of %d rows, lengths %s.',
        split,
        n,
        len(batches),
        batch_size,
        sorted({b['inputs'].shape[1] for b in batches}),
    )
    return batches


def restore_order(batches: Sequence[dict[str, np.ndarray]], outputs: Sequence[Sequence]) -> list:
    """Per-row outputs of ``make_eval_batches`` batches, in the split's order.

    Args:
      batches: the batches, as returned.
      outputs: one sequence per batch with one item per row (e.g. decoded ids or texts).

    Returns:
      A list with one output per example, example 0 first; filler rows are dropped.
    """
    if len(batches) != len(outputs):
        raise ValueError(f'{len(batches)} batches but {len(outputs)} outputs.')
    ordered = {}
    for batch, out in zip(batches, outputs, strict=True):
        if len(out) != len(batch['index']):
            raise ValueError(f'{len(out)} outputs for a batch of {len(batch["index"])} rows.')
        for i, item in zip(batch['index'].tolist(), out, strict=True):
            if i >= 0:
                ordered[i] = item
    if sorted(ordered) != list(range(len(ordered))):
        raise ValueError('The batches do not cover examples 0..n-1 exactly once.')
    return [ordered[i] for i in range(len(ordered))]


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """A split ready to score: its evaluation batches and the raw references, in order."""

    split: str
    batches: list[dict[str, np.ndarray]]
    references: list[str]


def make_eval_set(
    data_config: Any,
    tokenizer: Tokenizer,
    split: str,
    *,
    batch_size: int,
    cache_dir: str | None = None,
    max_examples: int | None = None,
) -> EvalSet:
    """`make_eval_batches` of ``split`` plus its first ``max_examples`` raw references."""
    batches = make_eval_batches(
        data_config,
        tokenizer,
        split,
        batch_size=batch_size,
        cache_dir=cache_dir,
        max_examples=max_examples,
    )
    _, references = load_text(data_config, split)
    num_examples = sum(int((b['index'] >= 0).sum()) for b in batches)
    return EvalSet(split, batches, references[:num_examples])


def eval_set_of_lines(
    tokenizer: Tokenizer,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    batch_size: int,
    name: str,
) -> EvalSet:
    """An `EvalSet` of given sentences (one source and one reference a line), named ``name``:
    any pair of files scored as a split is."""
    if len(sources) != len(references):
        raise ValueError(f'{len(sources)} sources but {len(references)} references.')
    source_ids, source_offsets = encode_texts(tokenizer, sources, 'source')
    target_ids, target_offsets = encode_texts(tokenizer, references, 'target')
    sources_ids = np.split(source_ids, source_offsets[1:-1])
    targets_ids = np.split(target_ids, target_offsets[1:-1])
    batches = batch_examples(sources_ids, targets_ids, batch_size, tokenizer.special)
    return EvalSet(name, batches, list(references))
