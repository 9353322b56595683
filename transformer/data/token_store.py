"""The token ids of a training split on disk, memory-mapped: written once by a streaming pass,
read by every process of every run that trains on them.

A store is a directory ``<cache_dir>/<dataset>-<split>-<key>.store/`` (the key is the token
cache's, `tokenized.cache_key`: the data's identity and the vocabulary) of flat binary arrays
that numpy memory-maps, and a manifest:

    source_ids.bin, target_ids.bin          each example's ids followed by EOS, one after
                                            another (uint16 when the vocabulary has at most
                                            65536 ids, else int32)
    source_lengths.bin, target_lengths.bin  each example's token count, EOS included (uint16
                                            when every length fits, else uint32)
    source_offsets.bin, target_offsets.bin  where each example starts, N + 1 of them (uint32
                                            while the side has under 2^32 tokens, else uint64)
    manifest.json                           dtype, count, bytes, CRC-32 and modification
                                            time of each file; N (store_manifest.py)

It is written in a staging directory beside it, checked in full (every file's checksum) and
renamed into place, so a store is whole or absent. Opening it checks the manifest and each
file's size and modification time, reading no file: a missing, truncated or rewritten file
stops in one line instead of being read as other tokens, and a file whose time disagrees is
checked in full (store_manifest.py says which damage only the full check finds:
``transformer-prepare --verify``). Writing holds one chunk of text at a time
(`sources.read_chunks`), whatever the corpus's size. A process that trains holds the lengths
(memory-mapped; packing copies them clipped to ``data.max_len``: 2 bytes a side) and the ids
only as pages of the files (the operating system's page cache, shared by the processes of a
host), never the text.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from absl import logging

from transformer.data import sources, store_manifest, tokenized
from transformer.data.errors import DataError
from transformer.data.tokenized import TokenizedSplit, encode_texts
from transformer.data.tokenizer import Tokenizer

SIDES = ('source', 'target')
_BLOCK = 1 << 24  # bytes read or written at a time by the narrowing pass
PROGRESS_EVERY_S = 10.0  # seconds between two progress lines of a long preparation


@dataclasses.dataclass(frozen=True)
class TokenStore:
    """A store opened for reading: each array memory-mapped (read-only). Offers what packing
    reads of a `TokenizedSplit` (ids, offsets and lengths of each side)."""

    path: str
    source_ids: np.ndarray
    source_offsets: np.ndarray
    source_lengths: np.ndarray
    target_ids: np.ndarray
    target_offsets: np.ndarray
    target_lengths: np.ndarray

    @property
    def num_examples(self) -> int:
        return len(self.source_lengths)


def store_dir(cache_dir: str, data_config: Any, tokenizer: Tokenizer, split: str) -> str:
    """Where the store of ``split`` lives (named as the split's token cache, `.store`)."""
    return tokenized.cache_path(cache_dir, data_config, tokenizer, split)[: -len('.npz')] + '.store'


def build(
    path: str,
    chunks: Iterable[tuple[list[str], list[str]]],
    tokenizer: Tokenizer,
    progress: Callable[[int, int, float], None] | None = None,
) -> None:
    """Tokenizes ``chunks`` of (sources, targets) into a new store at ``path``.

    Args:
      path: the store's directory; must not exist.
      chunks: the split's pairs, a chunk at a time (`sources.read_chunks`).
      tokenizer: the vocabulary.
      progress: called every `PROGRESS_EVERY_S` seconds with (pairs, tokens, seconds so far).
    """
    staging = _staging(path)
    try:
        writers = {side: _SideWriter(staging, side) for side in SIDES}
        start = last = time.perf_counter()
        pairs = 0
        for source_text, target_text in chunks:
            for side, texts in zip(SIDES, (source_text, target_text), strict=True):
                writers[side].add(*encode_texts(tokenizer, texts, side))
            pairs += len(source_text)
            if progress is not None and time.perf_counter() - last >= PROGRESS_EVERY_S:
                last = time.perf_counter()
                progress(pairs, sum(w.tokens for w in writers.values()), last - start)
        files = {}
        for writer in writers.values():
            files |= writer.finish()
        _seal(staging, path, files, pairs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def from_split(path: str, data: TokenizedSplit) -> None:
    """A store at ``path`` holding the token ids of ``data`` (a token cache read back), the
    same ids in the same order: what the runs that cached their ids in ``.npz`` files train
    on from now on."""
    staging = _staging(path)
    try:
        files = {}
        for side in SIDES:
            writer = _SideWriter(staging, side)
            writer.add(getattr(data, f'{side}_ids'), getattr(data, f'{side}_offsets'))
            files |= writer.finish()
        _seal(staging, path, files, data.num_examples)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def num_examples(path: str) -> int:
    """The number of examples the store at ``path`` holds, from its manifest alone (nothing
    is checked: `open_store` checks)."""
    return store_manifest.read(path)[1]


def open_store(path: str) -> TokenStore:
    """The store at ``path``, memory-mapped, after the quick check of an open (the manifest,
    each file's size and modification time; in full where a time disagrees:
    `store_manifest.check_on_open`) and that its offsets span its ids.

    Raises:
      DataError: a file is missing, of the wrong size (or checksum, where checked in full),
        or the manifest does not read: one line naming it and the fix (remove the store; it
        is built again).
    """
    files, count = store_manifest.check_on_open(path)
    arrays = {}
    for name, entry in files.items():
        dtype, key = np.dtype(entry['dtype']), name.removesuffix('.bin')
        if entry['count']:  # a plain array over the map: indexing a memmap costs more
            file = os.path.join(path, name)
            arrays[key] = np.asarray(np.memmap(file, dtype, mode='r', shape=(entry['count'],)))
        else:
            arrays[key] = np.zeros(0, dtype)
    for side in SIDES:
        if len(arrays[f'{side}_lengths']) != count or len(arrays[f'{side}_offsets']) != count + 1:
            raise DataError(
                f'The token store {path} does not hold {count} examples; '
                f'{store_manifest.fix(path)}.'
            )
        file = os.path.join(path, f'{side}_offsets.bin')
        if _ends(file, arrays[f'{side}_offsets'].dtype, count) != (0, len(arrays[f'{side}_ids'])):
            raise DataError(
                f'The token store file {file} does not span {side}_ids.bin; '
                f'{store_manifest.fix(path)}.'
            )
    return TokenStore(path=path, **arrays)


def _ends(file: str, dtype: np.dtype, count: int) -> tuple[int, int]:
    """The first and last of the ``count + 1`` offsets in ``file``, read as two values: not
    through the map, whose first touch of a page reads the kernel's whole read-ahead window
    around it (8 MiB on some hosts)."""
    fd = os.open(file, os.O_RDONLY)
    try:
        first, last = (os.pread(fd, dtype.itemsize, i * dtype.itemsize) for i in (0, count))
    finally:
        os.close(fd)
    return int(np.frombuffer(first, dtype)[0]), int(np.frombuffer(last, dtype)[0])


def verify(path: str) -> int:
    """The full check of the store at ``path`` (every file's checksum; the build's and
    ``transformer-prepare --verify``'s), then its open's; returns its number of examples.

    Raises:
      DataError: as `open_store`, a file that fails its checksum included.
    """
    count = store_manifest.verify(path)
    open_store(path)  # (quick now: the full check recorded any time that disagreed)
    return count


class _SideWriter:
    """Appends one side's ids and lengths to its files; `finish` narrows the lengths and
    writes the offsets, with the files' manifest entries."""

    def __init__(self, directory: str, side: str):
        self.directory, self.side = directory, side
        self.tokens = 0
        self.longest = 0
        self._ids_dtype: np.dtype | None = None
        self._ids = open(self._file('ids'), 'wb')
        self._lengths = open(self._file('lengths.wide'), 'wb')  # uint32, narrowed in `finish`
        self._crc = 0
        self._count = 0

    def _file(self, name: str) -> str:
        return os.path.join(self.directory, f'{self.side}_{name}.bin')

    def add(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        if self._ids_dtype is None:
            self._ids_dtype = ids.dtype
        ids = ids.astype(self._ids_dtype, copy=False)
        lengths = np.diff(offsets)
        raw = ids.tobytes()
        self._ids.write(raw)
        self._crc = zlib.crc32(raw, self._crc)
        self._lengths.write(lengths.astype(np.uint32).tobytes())
        self._count += len(ids)
        self.tokens += len(ids)
        self.longest = max(self.longest, int(lengths.max(initial=0)))

    def finish(self) -> dict[str, dict[str, Any]]:
        self._ids.close()
        self._lengths.close()
        ids_dtype = self._ids_dtype or np.dtype(np.uint16)
        entries = {f'{self.side}_ids.bin': store_manifest.entry(ids_dtype, self._count, self._crc)}
        wide = self._file('lengths.wide')
        lengths_dtype = np.uint16 if self.longest <= np.iinfo(np.uint16).max else np.uint32
        offsets_dtype = np.uint32 if self.tokens < 2**32 else np.uint64
        entries |= _narrow(
            wide, self._file('lengths'), lengths_dtype, self._file('offsets'), offsets_dtype
        )
        os.unlink(wide)
        return entries


def _narrow(wide: str, lengths_path: str, lengths_dtype, offsets_path: str, offsets_dtype):
    """Rewrites the uint32 lengths of ``wide`` as ``lengths_dtype`` and their running sums
    (from 0) as the offsets, a block at a time; their manifest entries."""
    crcs, counts, total = [0, 0], [0, 1], 0
    zero = np.zeros(1, offsets_dtype).tobytes()
    with (
        open(wide, 'rb') as src,
        open(lengths_path, 'wb') as out_l,
        open(offsets_path, 'wb') as out_o,
    ):
        out_o.write(zero)
        crcs[1] = zlib.crc32(zero)
        while block := src.read(_BLOCK):
            lengths = np.frombuffer(block, np.uint32)
            narrow = lengths.astype(lengths_dtype).tobytes()
            offsets = (total + np.cumsum(lengths, dtype=np.uint64)).astype(offsets_dtype).tobytes()
            total += int(lengths.sum(dtype=np.uint64))
            out_l.write(narrow)
            out_o.write(offsets)
            crcs = [zlib.crc32(narrow, crcs[0]), zlib.crc32(offsets, crcs[1])]
            counts = [counts[0] + len(lengths), counts[1] + len(lengths)]
    return {
        os.path.basename(lengths_path): store_manifest.entry(
            np.dtype(lengths_dtype), counts[0], crcs[0]
        ),
        os.path.basename(offsets_path): store_manifest.entry(
            np.dtype(offsets_dtype), counts[1], crcs[1]
        ),
    }


def _seal(staging: str, path: str, files: dict[str, dict[str, Any]], count: int) -> None:
    """Writes the manifest of ``staging``, checks the files in full against it (what was
    written is what was counted) and renames ``staging`` to ``path``."""
    store_manifest.write(staging, files, count)
    try:
        store_manifest.verify(staging)
    except store_manifest.Damaged as e:
        raise DataError(
            f'The token store {path} failed its check after writing: '
            f'{os.path.basename(e.file)} {e.reason}; nothing was kept: check the disk holding '
            'it, then prepare again.'
        ) from None
    os.replace(staging, path)


def _staging(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(dir=parent, prefix=f'.{os.path.basename(path)}.tmp-')


def log_progress(pairs: int, tokens: int, seconds: float) -> None:
    """The one-line progress report of a long preparation."""
    logging.info(
        'Preparing the training data: %s pairs, %s tokens in %.0f s (%s tokens/s).',
        f'{pairs:,}',
        f'{tokens:,}',
        seconds,
        f'{tokens / max(seconds, 1e-9):,.0f}',
    )


def prepare(data_config: Any, tokenizer: Tokenizer, cache_dir: str, split: str) -> str:
    """The store of ``split``: opened where it exists, else made from the split's token
    cache of an earlier version (``.npz``; one line says so) or tokenized from the text.
    Returns its path. In a multi-host run one process calls this, the others `open_store`."""
    path = store_dir(cache_dir, data_config, tokenizer, split)
    if os.path.isdir(path):
        return path
    old = tokenized.cache_path(cache_dir, data_config, tokenizer, split)
    start = time.perf_counter()
    data = tokenized.load_cache(old, split) if os.path.isfile(old) else None
    if data is not None:
        from_split(path, data)
        logging.info('Converted the token cache %s into the token store %s (once).', old, path)
        return path
    build(path, sources.read_chunks(data_config, split), tokenizer, log_progress)
    logging.info(
        'Tokenized %d %s pairs into the token store %s in %.1f s.',
        num_examples(path),
        split,
        path,
        time.perf_counter() - start,
    )
    return path


def open_prepared(
    data_config: Any, tokenizer: Tokenizer, cache_dir: str, split: str, build: bool
) -> TokenStore:
    """The store of ``split``, opened; built first where it is missing and ``build`` allows
    (`prepare`), else (a process other than a multi-host run's process 0) a one-line
    `DataError`."""
    if build:
        return open_store(prepare(data_config, tokenizer, cache_dir, split))
    path = store_dir(cache_dir, data_config, tokenizer, split)
    if not os.path.isdir(path):
        raise DataError(
            f'This process finds no token store at {path}, which process 0 prepared: every '
            'process of a multi-host run must see the same data.cache_dir (a shared file system).'
        )
    return open_store(path)
