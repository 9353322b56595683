"""Multi30k's raw files (multi30k/dataset, data/task1/raw): their names, where a directory
holds them, and their lines. Read by multi30k.py directly and by the TFDS builder in
multi30k_tfds.py."""

from __future__ import annotations

import gzip

from etils import epath

from transformer.data.errors import DataError

LANGUAGES = ('en', 'de')
REQUIRED_SPLITS = ('train', 'validation', 'test2016')
OPTIONAL_SPLITS = ('test2017', 'test2018', 'mscoco2017')

# Split -> file stems that hold it: the short name first, then the repository's name.
FILE_STEMS = {
    'train': ('train',),
    'validation': ('val', 'validation'),
    'test2016': ('test2016', 'test_2016_flickr'),
    'test2017': ('test2017', 'test_2017_flickr'),
    'test2018': ('test2018', 'test_2018_flickr'),
    'mscoco2017': ('mscoco2017', 'test_2017_mscoco'),
}


def expected_files() -> list[str]:
    """The names of the files a manual directory must hold (one per required split and language)."""
    return [f'{FILE_STEMS[split][0]}.{lang}' for split in REQUIRED_SPLITS for lang in LANGUAGES]


def find_files(manual_dir: epath.PathLike | None) -> dict[str, dict[str, epath.Path]]:
    """The splits whose files (both languages) are in ``manual_dir``: {split: {lang: path}}."""
    if manual_dir is None:
        return {}
    root = epath.Path(manual_dir)
    if not root.is_dir():
        return {}
    found = {}
    for split, stems in FILE_STEMS.items():
        paths = {}
        for lang in LANGUAGES:
            for stem in stems:
                for name in (f'{stem}.{lang}', f'{stem}.{lang}.gz'):
                    if (root / name).is_file() and lang not in paths:
                        paths[lang] = root / name
        if len(paths) == len(LANGUAGES):
            found[split] = paths
    return found


def read_lines(path: epath.Path) -> list[str]:
    data = path.read_bytes()
    # By content, not name: downloaded files are renamed by the download manager.
    if data[:2] == b'\x1f\x8b':
        data = gzip.decompress(data)
    # split('\n'), not splitlines(): captions may contain other Unicode line separators.
    lines = data.decode('utf-8').split('\n')
    if lines and not lines[-1]:
        lines.pop()
    return [line.rstrip('\r') for line in lines]


def read_files(paths: dict[str, epath.Path]) -> dict[str, list[str]]:
    """{lang: lines} of one split's files, checked to be aligned."""
    columns = {lang: read_lines(path) for lang, path in paths.items()}
    counts = {lang: len(lines) for lang, lines in columns.items()}
    if len(set(counts.values())) != 1:
        raise DataError(f'Multi30k files {paths} have different line counts {counts}.')
    return columns
