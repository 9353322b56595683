"""Multi30k (WMT16 multimodal translation, task 1), text only, English-German, as a TFDS builder.

29000 training, 1014 validation and 1000 test2016 sentence pairs of image captions (Elliott et
al., 2016). The raw, untokenized, original-case files of the multi30k/dataset GitHub repository
(data/task1/raw/*.gz) are either read from a manual directory (no network needed) or
downloaded. The manual directory may hold the repository's names, gzipped or not
(``train.en.gz``, ``val.de``, ``test_2016_flickr.en`` ...), or the short names ``train.en``,
``val.en``, ``test2016.en`` ...

Splits: 'train', 'validation', 'test2016', and 'test2017', 'test2018', 'mscoco2017' when their
files are present. Examples keep the order of the files (shuffling is disabled), so line i of
a split is example i.
"""

from __future__ import annotations

import gzip
import os
from typing import Any

import ml_collections
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from transformer.data import tfds_translate
from transformer.data.errors import DataError

LANGUAGES = ('en', 'de')
REQUIRED_SPLITS = ('train', 'validation', 'test2016')
OPTIONAL_SPLITS = ('test2017', 'test2018', 'mscoco2017')

# Split -> file stems that hold it: the short name first, then the repository's name.
_FILE_STEMS = {
    'train': ('train',),
    'validation': ('val', 'validation'),
    'test2016': ('test2016', 'test_2016_flickr'),
    'test2017': ('test2017', 'test_2017_flickr'),
    'test2018': ('test2018', 'test_2018_flickr'),
    'mscoco2017': ('mscoco2017', 'test_2017_mscoco'),
}
_URL = 'https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz'
DOWNLOAD_HOST = 'raw.githubusercontent.com'

_CITATION = """
@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
  doi = {10.18653/v1/W16-3210},
}
"""


def expected_files() -> list[str]:
    """The names of the files a manual directory must hold (one per required split and language)."""
    return [f'{_FILE_STEMS[split][0]}.{lang}' for split in REQUIRED_SPLITS for lang in LANGUAGES]


def find_files(manual_dir: epath.PathLike | None) -> dict[str, dict[str, epath.Path]]:
    """The splits whose files (both languages) are in ``manual_dir``: {split: {lang: path}}."""
    if manual_dir is None:
        return {}
    root = epath.Path(manual_dir)
    if not root.is_dir():
        return {}
    found = {}
    for split, stems in _FILE_STEMS.items():
        paths = {}
        for lang in LANGUAGES:
            for stem in stems:
                for name in (f'{stem}.{lang}', f'{stem}.{lang}.gz'):
                    if (root / name).is_file() and lang not in paths:
                        paths[lang] = root / name
        if len(paths) == len(LANGUAGES):
            found[split] = paths
    return found


def has_manual_files(manual_dir: epath.PathLike | None) -> bool:
    """Whether ``manual_dir`` holds the files of every required split."""
    return set(REQUIRED_SPLITS) <= set(find_files(manual_dir))


def _read_lines(path: epath.Path) -> list[str]:
    data = path.read_bytes()
    # By content, not name: downloaded files are renamed by the download manager.
    if data[:2] == b'\x1f\x8b':
        data = gzip.decompress(data)
    # split('\n'), not splitlines(): captions may contain other Unicode line separators.
    lines = data.decode('utf-8').split('\n')
    if lines and not lines[-1]:
        lines.pop()
    return [line.rstrip('\r') for line in lines]


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1 (text only), English-German, from the raw files."""

    VERSION = tfds.core.Version('1.0.0')
    RELEASE_NOTES = {'1.0.0': 'Raw text of train, val and the test sets, in file order.'}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        'Put the raw files of https://github.com/multi30k/dataset/tree/master/data/task1/raw '
        f'(gzipped or not) in the manual directory: {", ".join(expected_files())} '
        '(or the repository names, e.g. test_2016_flickr.en.gz).'
    )

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description='Multi30k task 1 (WMT16 multimodal translation), text only, en-de.',
            features=tfds.features.Translation(languages=LANGUAGES),
            supervised_keys=LANGUAGES,
            homepage='https://github.com/multi30k/dataset',
            citation=_CITATION,
            # Keeps line i of a file as example i, as references and test sets expect.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        files = self._manual_files(dl_manager)
        if files:
            logging.info('Multi30k: reading the manual files %s.', files)
        else:
            files = self._download(dl_manager)
        return {split: self._generate_examples(paths) for split, paths in files.items()}

    @staticmethod
    def _manual_files(dl_manager) -> dict[str, dict[str, epath.Path]]:
        # Manual files, when present, win: no download is attempted then.
        try:
            manual_dir = dl_manager.manual_dir
        except (AssertionError, ValueError):
            return {}
        files = find_files(manual_dir)
        return files if set(REQUIRED_SPLITS) <= set(files) else {}

    @staticmethod
    def _download(dl_manager) -> dict[str, dict[str, epath.Path]]:
        def urls(split):
            stem = _FILE_STEMS[split][-1]
            return {lang: _URL.format(stem=stem, lang=lang) for lang in LANGUAGES}

        files = {split: dl_manager.download(urls(split)) for split in REQUIRED_SPLITS}
        for split in OPTIONAL_SPLITS:
            try:
                files[split] = dl_manager.download(urls(split))
            except Exception as e:  # An optional test set may be missing upstream.
                logging.warning('Multi30k: no %s split (%s).', split, e)
        return {
            split: {lang: epath.Path(os.fspath(path)) for lang, path in paths.items()}
            for split, paths in files.items()
        }

    def _generate_examples(self, paths: dict[str, epath.Path]):
        columns = {lang: _read_lines(path) for lang, path in paths.items()}
        counts = {lang: len(lines) for lang, lines in columns.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f'Multi30k files {paths} have different line counts {counts}.')
        for i, pair in enumerate(zip(*columns.values(), strict=True)):
            yield i, dict(zip(columns, pair, strict=True))


def add_config(config: ml_collections.ConfigDict) -> None:
    """Multi30k reads ``data.manual_dir`` and ``data.data_dir`` (see tfds_translate.py)."""
    tfds_translate.add_config(config)


def read(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of a split, prepared from ``data.manual_dir`` or downloaded once."""
    tfds_translate.check_languages('multi30k', LANGUAGES, data_config)
    builder = Multi30k(data_dir=data_config.data_dir, file_format='tfrecord')
    if not builder.is_prepared() and not tfds_translate.download_is_mocked(builder):
        manual_dir = data_config.manual_dir
        if has_manual_files(manual_dir):
            logging.info('Preparing multi30k from %s into %s.', manual_dir, builder.data_dir)
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(manual_dir=os.fspath(manual_dir))
            )
        elif tfds_translate.network_reachable((DOWNLOAD_HOST,)):
            logging.info('Downloading multi30k into %s.', builder.data_dir)
            builder.download_and_prepare()
        else:
            where = f'data.manual_dir={manual_dir}' if manual_dir else 'data.manual_dir (unset)'
            raise DataError(
                f'Multi30k is not prepared in {builder.data_dir}, there is no network to download '
                f'it, and {where} lacks the raw files {", ".join(expected_files())} '
                '(plain or .gz, from github.com/multi30k/dataset data/task1/raw): put them there.'
            )
    return tfds_translate.read_builder(builder, split, data_config)


def identity(data_config: Any, split: str) -> dict[str, Any]:
    return {}
