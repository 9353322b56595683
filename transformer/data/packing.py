"""Packed training batches that resume exactly.

The paper batches sentence pairs of similar length into ~25000 source and ~25000
target tokens (Sec. 5.1); with static shapes for XLA the same token budget is a fixed number
of rows of ``max_len`` tokens, each packed with several examples. Every example is a segment
of a row: segment ids 1, 2, ... (0 = padding) and positions restarting at 0, on the source and
on the target side alike, so the model can keep examples apart (attention masks) and give
each its own positions.

How rows are filled: each epoch shuffles the examples with a permutation drawn from (seed,
epoch), cuts it into chunks of 65536 examples and packs each chunk first-fit into a window of 8
open rows: an example goes into the first open row where both its source and its target fit;
when none has room, the oldest open row is closed and a new one opened. A single open row
(greedy sequential packing) wastes the tail of every row that the next example overflows;
eight let short examples fill those tails, at a cost of a few Python operations per example.
Rows keep the order in which they close. Source and target share one row, so the longer side
of a row fills it and the shorter side's remainder is padding; the padding fraction reported
by ``TrainIterator.stats()`` counts both sides. Measured on Multi30k (8k BPE, max_len 64):
7.7% padding, 3.8 pairs a row (greedy packing: 16.1%).

Resuming. The iterator's state is (seed, epoch, chunk, row): the next row is row ``row`` of
chunk ``chunk`` of epoch ``epoch``. Restoring packs that one chunk again (deterministic,
milliseconds to ~0.2 s), without replaying the batches before it.

Multi-host. All processes compute the same packing (it needs only the lengths); a process of
data group g of G materializes rows [g * B / G, (g + 1) * B / G) of each global batch of B
rows. The group follows the device mesh (transformer/training/parallel.py, `data_groups`):
usually one group per process, fewer when the ``model`` mesh axis spans processes.

"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer.data.errors import DataError
from transformer.data.mix import Corpora, training_corpora
from transformer.data.token_store import TokenStore
from transformer.data.tokenized import TokenizedSplit
from transformer.data.tokenizer import Tokenizer
from transformer.tokens import JOINT, SpecialIds

CHUNK_SIZE = 1 << 16  # examples packed together; bounds the cost of restoring a state
OPEN_ROWS = 8  # rows open at once in first-fit packing


def pack_examples(
    source_lengths: np.ndarray,
    target_lengths: np.ndarray,
    max_len: int,
    open_rows: int = OPEN_ROWS,
) -> tuple[np.ndarray, np.ndarray]:
    """Packs examples, in the given order, first-fit into rows of ``max_len`` tokens a side.

    Args:
      source_lengths: [N] source lengths, each 1..max_len.
      target_lengths: [N] target lengths, each 1..max_len.
      max_len: row length.
      open_rows: rows open at once; 1 = greedy sequential packing.

    Returns:
      (members, row_starts): ``members[row_starts[r]:row_starts[r + 1]]`` are the positions
      (0..N-1) of the examples of row r, in the order they sit in the row.
    """
    rows = []
    window = []  # [source room, target room, members] of the open rows, oldest first
    for i, (s, t) in enumerate(zip(source_lengths.tolist(), target_lengths.tolist(), strict=True)):
        for row in window:
            if s <= row[0] and t <= row[1]:
                row[0] -= s
                row[1] -= t
                row[2].append(i)
                break
        else:
            if len(window) == open_rows:
                rows.append(window.pop(0)[2])
            window.append([max_len - s, max_len - t, [i]])
    rows += [row[2] for row in window]
    sizes = np.array([len(row) for row in rows], np.int64)
    members = np.fromiter((i for row in rows for i in row), np.int64, int(sizes.sum()))
    return members, np.concatenate([[0], np.cumsum(sizes)])


def _fill_rows(
    rows: Sequence[np.ndarray],
    corpora: Corpora,
    side: str,
    lengths: np.ndarray,
    width: int,
    special: SpecialIds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One side of packed rows: tokens (``special.pad`` pads), segments, positions [R, width].

    Vectorized over all tokens of the batch. ``lengths`` may be shorter than the stored
    example (truncation); the last token written for an example is always EOS.
    """
    tokens = np.full((len(rows), width), special.pad, np.int32)
    segments = np.zeros_like(tokens)
    positions = np.zeros_like(tokens)
    counts = np.array([len(r) for r in rows], np.int64)
    if counts.sum() == 0:
        return tokens, segments, positions
    examples = np.concatenate(rows)
    row_of_example = np.repeat(np.arange(len(rows)), counts)
    first_of_row = np.concatenate([[0], np.cumsum(counts)[:-1]])
    segment = np.arange(len(examples)) - np.repeat(first_of_row, counts) + 1
    lens = lengths[examples].astype(np.int64)  # (narrow in memory: unsigned arithmetic below)
    ends = np.cumsum(lens)
    starts = ends - lens
    column0 = starts - np.repeat(starts[first_of_row], counts)  # example start within its row
    token_example = np.repeat(np.arange(len(examples)), lens)
    within = np.arange(int(ends[-1])) - np.repeat(starts, lens)
    values = corpora.gather(side, examples, token_example, within)
    values[ends - 1] = special.eos
    r, c = row_of_example[token_example], column0[token_example] + within
    tokens[r, c] = values
    segments[r, c] = segment[token_example]
    positions[r, c] = within
    return tokens, segments, positions


# What happens to a training pair longer than a row: dropped, or cut (keeping its EOS).
LONG_EXAMPLES = ('drop', 'truncate')


_BOOKKEEPING_BLOCK = 1 << 24  # examples whose lengths are scanned at once


def _kept_examples(data: Any, max_len: int, long_examples: str) -> tuple[np.ndarray, int, int]:
    """(the indices of the examples trained on, ascending, as uint32 while they fit; the
    number of empty ones; the number longer than ``max_len``), scanned a block at a time so
    that no int64 or boolean array of the whole split is ever held."""
    count = data.num_examples
    dtype = np.uint32 if count <= np.iinfo(np.uint32).max else np.int64
    kept, empty, long = [], 0, 0
    for start in range(0, count, _BOOKKEEPING_BLOCK):
        block = slice(start, start + _BOOKKEEPING_BLOCK)
        sources, targets = data.source_lengths[block], data.target_lengths[block]
        # A side with only its EOS is an empty sentence: nothing to learn from the pair.
        is_empty = (sources <= 1) | (targets <= 1)
        is_long = ~is_empty & ((sources > max_len) | (targets > max_len))
        keep = ~is_empty if long_examples == 'truncate' else ~is_empty & ~is_long
        kept.append((np.flatnonzero(keep) + start).astype(dtype))
        empty, long = empty + int(is_empty.sum()), long + int(is_long.sum())
    return (np.concatenate(kept) if kept else np.zeros(0, dtype)), empty, long


def _clipped(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """``lengths`` clipped to ``max_len``, in memory, in the narrowest unsigned type that
    holds ``max_len`` (2 bytes a pair for any row length up to 65535)."""
    dtype = np.uint16 if max_len <= np.iinfo(np.uint16).max else np.uint32
    return np.minimum(lengths, min(max_len, np.iinfo(lengths.dtype).max)).astype(dtype)


class TrainIterator(Iterator[dict[str, np.ndarray]]):
    """Infinite iterator of packed training batches with a small, exact, resumable state.

    Each batch is a dict of int32 arrays [batch_size // data_groups, max_len] under the keys
    inputs, targets, inputs_segmentation, targets_segmentation, inputs_positions,
    targets_positions; ``special``: the vocabulary's ids (its pad, its eos: `_fill_rows`).
    """

    def __init__(
        self,
        data: TokenizedSplit | TokenStore | Corpora,
        *,
        batch_size: int,
        seed: int,
        max_len: int,
        data_group: int = 0,
        data_groups: int = 1,
        long_examples: str = 'drop',
        chunk_size: int = CHUNK_SIZE,
        open_rows: int = OPEN_ROWS,
        special: SpecialIds = JOINT,
    ):
        if batch_size % data_groups:
            raise ValueError(f'batch_size={batch_size} is not divisible by {data_groups=}.')
        if not 0 <= data_group < data_groups:
            raise ValueError(f'{data_group=} is not in [0, {data_groups}).')
        if long_examples not in LONG_EXAMPLES:
            raise ValueError(f"long_examples must be 'drop' or 'truncate', got {long_examples!r}.")
        data = data if isinstance(data, Corpora) else Corpora([data])
        self._data, self._special = data, special  # the rows' tokens and their pad and eos
        self.last_pairs: dict[str, int] = {}  # each named corpus's pairs in the last batch
        self.batch_size = batch_size
        self.max_len = max_len
        self.data_group = data_group
        self.data_groups = data_groups
        self._chunk_size, self._open_rows = chunk_size, open_rows

        self._examples, empty, long = _kept_examples(data, max_len, long_examples)
        if not len(self._examples):
            raise DataError(
                f'No training example fits max_len={max_len} ({data.num_examples} examples, '
                f'{empty} empty): raise data.max_len.'
            )
        self._source_lengths = _clipped(data.source_lengths, max_len)
        self._target_lengths = _clipped(data.target_lengths, max_len)
        self._counts = {
            'num_examples': int(len(self._examples)),
            'empty_dropped': empty,
            'long_dropped': long if long_examples == 'drop' else 0,
            'long_truncated': long if long_examples == 'truncate' else 0,
        }
        if long:
            logging.info(
                '%d of %d training examples are longer than max_len=%d: %s.',
                long,
                data.num_examples,
                max_len,
                'dropped' if long_examples == 'drop' else 'truncated',
            )
        self._num_chunks = -(-data.epoch_size(self._examples) // chunk_size)
        self._permutation: tuple[int, int, np.ndarray] | None = None  # (seed, epoch, perm)
        self._packings: collections.OrderedDict = collections.OrderedDict()
        self._packed = collections.Counter()  # totals over the chunks packed so far
        self._seed = int(seed)
        self._epoch = self._chunk = self._row = 0
        self._packing(self._epoch, self._chunk)

    @property
    def epoch(self) -> int:
        """The epoch of the next row (0-based)."""
        return self._epoch

    def get_state(self) -> dict[str, int]:
        """The position of the next batch, JSON-serialisable."""
        return {'seed': self._seed, 'epoch': self._epoch, 'chunk': self._chunk, 'row': self._row}

    def set_state(self, state: dict[str, int]) -> None:
        """Continues from ``state`` (from ``get_state``) with exactly the batches that followed."""
        self._seed = int(state['seed'])
        self._epoch, self._chunk, self._row = (
            int(state['epoch']),
            int(state['chunk']),
            int(state['row']),
        )
        fix = (
            'the training data or its packing (data.*, train.batch_size) changed since the '
            "checkpoint; resume with the run's own config.json, or use a new --workdir."
        )
        if not 0 <= self._chunk < self._num_chunks:
            raise ValueError(
                f'Data position {state} does not fit this dataset ({self._num_chunks} chunks): '
                f'{fix}'
            )
        members, row_starts = self._packing(self._epoch, self._chunk)
        if not 0 <= self._row < len(row_starts) - 1:
            raise ValueError(f'Data position {state} does not fit this dataset: {fix}')

    def stats(self) -> dict[str, float]:
        """Packing figures over the chunks packed so far (all processes' rows).

        Returns:
          padding_fraction (both sides), padding_fraction_inputs / _targets,
          examples_per_row, rows, num_examples (usable), empty_dropped, long_dropped,
          long_truncated.
        """
        p = self._packed
        slots = max(p['rows'] * self.max_len, 1)
        return {
            'padding_fraction': 1 - (p['source_tokens'] + p['target_tokens']) / (2 * slots),
            'padding_fraction_inputs': 1 - p['source_tokens'] / slots,
            'padding_fraction_targets': 1 - p['target_tokens'] / slots,
            'examples_per_row': p['examples'] / max(p['rows'], 1),
            'rows': p['rows'],
            **self._counts,
        }

    def _epoch_permutation(self, epoch: int) -> np.ndarray:
        if self._permutation is None or self._permutation[:2] != (self._seed, epoch):
            examples = self._data.epoch_examples(self._seed, epoch, self._examples)
            self._permutation = (self._seed, epoch, examples)
        return self._permutation[2]

    def _packing(self, epoch: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """(example indices in row order, row starts) of one chunk of one epoch."""
        key = (self._seed, epoch, chunk)
        if key not in self._packings:
            examples = self._epoch_permutation(epoch)[
                chunk * self._chunk_size : (chunk + 1) * self._chunk_size
            ]
            members, row_starts = pack_examples(
                self._source_lengths[examples],
                self._target_lengths[examples],
                self.max_len,
                self._open_rows,
            )
            self._packings[key] = (examples[members], row_starts)
            self._packed.update(
                rows=len(row_starts) - 1,
                examples=len(examples),
                source_tokens=int(self._source_lengths[examples].sum()),
                target_tokens=int(self._target_lengths[examples].sum()),
            )
            while len(self._packings) > 2:  # a batch spans at most a few chunks
                self._packings.popitem(last=False)
        return self._packings[key]

    def _next_rows(self) -> list[np.ndarray]:
        """The example indices of each row of the next global batch; advances the state."""
        rows = []
        while len(rows) < self.batch_size:
            members, row_starts = self._packing(self._epoch, self._chunk)
            num_rows = len(row_starts) - 1
            take = min(self.batch_size - len(rows), num_rows - self._row)
            rows += [
                members[row_starts[r] : row_starts[r + 1]]
                for r in range(self._row, self._row + take)
            ]
            self._row += take
            if self._row == num_rows:
                self._row = 0
                self._chunk += 1
                if self._chunk == self._num_chunks:
                    self._chunk = 0
                    self._epoch += 1
        return rows

    def __next__(self) -> dict[str, np.ndarray]:
        rows = self._next_rows()
        local = self.batch_size // self.data_groups
        self.last_pairs = self._data.pairs(rows)  # (all processes' rows)
        rows = rows[self.data_group * local : (self.data_group + 1) * local]
        inputs, inputs_segmentation, inputs_positions = _fill_rows(
            rows, self._data, 'source', self._source_lengths, self.max_len, self._special
        )
        targets, targets_segmentation, targets_positions = _fill_rows(
            rows, self._data, 'target', self._target_lengths, self.max_len, self._special
        )
        return {
            'inputs': inputs,
            'targets': targets,
            'inputs_segmentation': inputs_segmentation,
            'targets_segmentation': targets_segmentation,
            'inputs_positions': inputs_positions,
            'targets_positions': targets_positions,
        }


def make_train_iterator(
    data_config: Any,
    tokenizer: Tokenizer,
    *,
    batch_size: int,
    seed: int,
    cache_dir: str | None = None,
    data_group: int = 0,
    data_groups: int = 1,
    build: bool = True,
) -> TrainIterator:
    """Packed training batches of ``data_config.train_split``.

    Args:
      data_config: the ``data`` config section.
      tokenizer: the vocabulary.
      batch_size: global number of packed rows per batch (all data groups together).
      seed: the shuffling seed; the same seed gives the same batches.
      cache_dir: where the split's token store lives (transformer/data/token_store.py), read
        memory-mapped; None: the split is tokenized into memory. With ``data.mix``, one
        store (or split) per entry (transformer/data/mix.py).
      data_group: the block of each batch this process feeds (`Parallel.data_group`).
      data_groups: number of blocks; each is batch_size // data_groups rows.
      build: whether this process may build a missing store (in a multi-host run, process 0
        builds it and the others only open it).

    Returns:
      The iterator; see TrainIterator.
    """
    start = time.perf_counter()
    iterator = TrainIterator(
        training_corpora(data_config, tokenizer, cache_dir, build),
        batch_size=batch_size,
        seed=seed,
        max_len=int(data_config.max_len),
        data_group=data_group,
        data_groups=data_groups,
        long_examples=data_config.long_examples,
        special=tokenizer.special,
    )
    stats = iterator.stats()
    logging.info(
        'Training data ready in %.1f s: %d examples, %.1f a row, %.1f%% padding '
        '(inputs %.1f%%, targets %.1f%%).',
        time.perf_counter() - start,
        stats['num_examples'],
        stats['examples_per_row'],
        100 * stats['padding_fraction'],
        100 * stats['padding_fraction_inputs'],
        100 * stats['padding_fraction_targets'],
    )
    return iterator
