"""Your own parallel text: aligned files in ``data.folder``, one sentence a line.

Files are named ``{split}.{lang}`` (``train.en``, ``train.de``) or ``{lang}.{split}.txt`` as
TFDS ``TranslateFolder`` names them. Line i of the source file is the translation of line i
of the target file.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from typing import Any

from etils import epath

from transformer.data import text
from transformer.data.errors import DataError

# Its key in the ``data`` section: (default, type, one-line description).
KEYS = {'folder': (None, str, "the directory of the text files, for dataset='folder'")}


def files(folder: epath.PathLike, split: str, lang: str) -> list[epath.Path]:
    """The candidate paths of one side of a split in a folder, in order of preference."""
    root = epath.Path(folder)
    return [root / f'{split}.{lang}', root / f'{lang}.{split}.txt']


def _read_lines(path: epath.Path) -> list[str]:
    # Hostile bytes (invalid UTF-8, NUL, CRLF, ...) are cleaned with a warning per line.
    return text.decode_lines(path.read_bytes(), str(path))


def check(data_config: Any) -> None:
    if not data_config.folder:
        raise DataError("dataset='folder' needs data.folder, the directory of the text files.")


def check_files(data_config: Any, splits: Sequence[str]) -> None:
    """Each side of each split has a file in the folder (checked before training writes)."""
    for split in splits:
        for lang in (data_config.source_lang, data_config.target_lang):
            _find(data_config.folder, split, lang)


def _find(folder: epath.PathLike, split: str, lang: str) -> epath.Path:
    candidates = files(folder, split, lang)
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise DataError(
            f'Missing file for split {split!r} ({lang}): expected '
            f'{" or ".join(map(str, candidates))}.'
        )
    return found


def read(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of a split."""
    check(data_config)
    paths = [
        _find(data_config.folder, split, lang)
        for lang in (data_config.source_lang, data_config.target_lang)
    ]
    columns = [_read_lines(p) for p in paths]
    sources, targets = columns
    if len(sources) != len(targets):
        raise DataError(
            f'{paths[0]} has {len(sources)} lines but {paths[1]} has {len(targets)}; '
            f'the files of split {split!r} must be aligned line by line.'
        )
    return sources, targets


def read_chunks(data_config: Any, split: str, size: int) -> Iterator[tuple[list[str], list[str]]]:
    """(sources, targets) of a split, ``size`` pairs at a time (the last chunk fewer), read
    line by line: a corpus of any size in the memory of one chunk."""
    check(data_config)
    paths = [
        _find(data_config.folder, split, lang)
        for lang in (data_config.source_lang, data_config.target_lang)
    ]
    columns = [text.read_lines(os.fspath(p)) for p in paths]
    pairs = itertools.zip_longest(*columns)
    count = 0
    while chunk := list(itertools.islice(pairs, size)):
        if chunk[-1][0] is None or chunk[-1][1] is None:
            short = 0 if chunk[-1][0] is None else 1
            lines = [count + sum(pair[side] is not None for pair in chunk) for side in (0, 1)]
            lines[1 - short] += sum(1 for _ in columns[1 - short])
            raise DataError(
                f'{paths[0]} has {lines[0]} lines but {paths[1]} has {lines[1]}; '
                f'the files of split {split!r} must be aligned line by line.'
            )
        count += len(chunk)
        sources, targets = zip(*chunk, strict=True)
        yield list(sources), list(targets)


def identity(data_config: Any, split: str) -> dict[str, Any]:
    """Edited files must not reuse stale token ids: their sizes and times key the cache."""
    found = []
    if data_config.folder:
        for lang in (data_config.source_lang, data_config.target_lang):
            for candidate in files(data_config.folder, split, lang):
                if candidate.is_file():
                    stat = os.stat(candidate)
                    found.append([os.path.abspath(candidate), stat.st_size, stat.st_mtime_ns])
    return {'files': found}
