"""The token store's manifest and the checks of a store's files against it.

``manifest.json`` records, for each file of a store (transformer/data/token_store.py), its
dtype, count, bytes, CRC-32 and modification time (``mtime_ns``), and the number of examples.

Two checks, by what they cost:

- **Full** (`verify`): every file's size and CRC-32, reading every byte. The build runs it on
  the staging directory before renaming it into place; ``transformer-prepare --verify`` runs it
  on each store of a config; an open runs it when the files' modification times disagree with
  the manifest (a store copied without them, edited, or written before they were recorded), and
  then records the files' times (where the store is writable), so that later opens are quick.
- **Quick** (every other open, `check_on_open`): the manifest reads and every file exists with
  its recorded size and modification time. It reads the manifest, not the files: its cost does
  not grow with the store. What changes a file in place while keeping its size and time (a
  flipped bit on the disk, a copy that lost bytes but kept times) only the full check finds.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import zlib
from typing import Any

import numpy as np
from absl import logging

from transformer.data.errors import DataError

MANIFEST = 'manifest.json'
FORMAT = 1  # the manifest's ``format``: the layout of token_store.py
_BLOCK = 1 << 24  # bytes read at a time by the full check


def entry(dtype: np.dtype, count: int, crc: int) -> dict[str, Any]:
    """A file's manifest entry (its time is added by `write`)."""
    return {'dtype': dtype.str, 'count': count, 'bytes': count * dtype.itemsize, 'crc32': crc}


def write(
    directory: str,
    files: dict[str, dict[str, Any]],
    count: int,
    times: dict[str, int] | None = None,
) -> None:
    """Writes ``directory``'s manifest: ``files``' entries with each file's modification time
    (``times``, else the file's now), and ``count`` examples. Under a temporary name, then
    renamed: a reader sees the old manifest or the new one, whole."""
    if times is None:
        times = {name: os.stat(os.path.join(directory, name)).st_mtime_ns for name in files}
    stamped = {name: {**e, 'mtime_ns': times[name]} for name, e in files.items()}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{MANIFEST}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as f:
            json.dump({'format': FORMAT, 'num_examples': count, 'files': stamped}, f, indent=1)
            f.write('\n')
        os.replace(tmp, os.path.join(directory, MANIFEST))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def fix(path: str) -> str:
    """What to do about a damaged store."""
    return f'remove {path} and it is built again from the text (transformer-prepare or training)'


class Damaged(DataError):
    """A store's file that is not what its manifest says: ``file`` (its path), ``reason``."""

    def __init__(self, path: str, file: str, reason: str):
        super().__init__(f'The token store file {file} {reason}; {fix(path)}.')
        self.file, self.reason = file, reason


def read(path: str) -> tuple[dict[str, dict[str, Any]], int]:
    """The store's file entries and number of examples; a one-line `DataError` where the
    manifest does not read or is of another format."""
    try:
        with open(os.path.join(path, MANIFEST), encoding='utf-8') as f:
            manifest = json.load(f)
        files, count = manifest['files'], int(manifest['num_examples'])
        if manifest.get('format') != FORMAT:
            raise ValueError(f'format {manifest.get("format")!r}, not {FORMAT}')
        for e in files.values():
            _size(e)  # (a dtype or count that does not read is a manifest that does not)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f'The token store {path} has no readable {MANIFEST} ({e}); {fix(path)}.'
        ) from None
    return files, count


def _size(e: dict[str, Any]) -> int:
    return int(e['count']) * np.dtype(e['dtype']).itemsize


def _stats(path: str, files: dict[str, dict[str, Any]]) -> dict[str, os.stat_result]:
    """Each file's status; a one-line `DataError` for one missing or of another size."""
    stats = {}
    for name, e in files.items():
        file = os.path.join(path, name)
        try:
            stat = os.stat(file)
        except OSError:
            stat = None
        if stat is None or stat.st_size != _size(e):
            found = 'missing' if stat is None else f'{stat.st_size} bytes'
            raise Damaged(path, file, f'is {found}, its manifest says {_size(e)}')
        stats[name] = stat
    return stats


def _crc32(file: str) -> int:
    crc = 0
    with open(file, 'rb') as f:
        while block := f.read(_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def _check_sums(path: str, files: dict[str, dict[str, Any]]) -> None:
    for name, e in files.items():
        file = os.path.join(path, name)
        if _crc32(file) != e['crc32']:
            raise Damaged(path, file, 'fails its checksum')


def verify(path: str) -> int:
    """The full check: every file of the store at ``path`` has its recorded size and CRC-32
    (every byte is read); then the files' times are recorded where they disagree. Returns
    the number of examples.

    Raises:
      DataError: the manifest does not read, or (`Damaged`) a file is missing, of another
        size or fails its checksum: one line naming it and the fix (remove the store; it is
        built again).
    """
    files, count = read(path)
    _full_check(path, files, count, _stats(path, files))
    return count


def check_on_open(path: str) -> tuple[dict[str, dict[str, Any]], int]:
    """The check of an ordinary open: the manifest and each file's size and modification
    time; where a time disagrees (or none is recorded), the full check (`verify`). Returns
    the file entries and the number of examples.

    Raises:
      DataError: as `verify`.
    """
    files, count = read(path)
    stats = _stats(path, files)
    changed = [n for n, e in files.items() if e.get('mtime_ns') != stats[n].st_mtime_ns]
    if changed:
        start = time.perf_counter()
        _full_check(path, files, count, stats)
        logging.info(
            'The token store %s: %s changed since its manifest was written (modification '
            'time); checked in full in %.1f s.',
            path,
            ', '.join(changed),
            time.perf_counter() - start,
        )
    return files, count


def _times(stats: dict[str, os.stat_result]) -> dict[str, int]:
    return {name: stat.st_mtime_ns for name, stat in stats.items()}


def _full_check(
    path: str, files: dict[str, dict[str, Any]], count: int, stats: dict[str, os.stat_result]
) -> None:
    """Every file's checksum; then, where the times of ``stats`` (taken before) disagree with
    the manifest and no file changed meanwhile, the manifest again with those times, so that
    the next open is quick. A read-only store keeps its manifest (each open checks in full)."""
    _check_sums(path, files)
    times = _times(stats)
    if all(e.get('mtime_ns') == times[n] for n, e in files.items()):
        return
    if _times(_stats(path, files)) != times:
        return
    try:
        write(path, files, count, times)
    except OSError as e:
        logging.info(
            'The token store %s is checked in full on every open: its manifest cannot be '
            "rewritten with the files' times (%s).",
            path,
            e,
        )
