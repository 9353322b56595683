"""Multi30k as a TFDS builder, for downloading it and for TFDS users.

``multi30k.read`` reads raw files in ``data.manual_dir`` directly, without TensorFlow; this
builder is used only when there are none: it reads a copy prepared in ``data.data_dir`` or
downloads the raw files from GitHub and prepares one. Examples keep the order of the files
(shuffling is disabled), so line i of a split is example i, the same as the direct reading.
"""

from __future__ import annotations

import os

import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from transformer.data.multi30k_files import (
    FILE_STEMS,
    LANGUAGES,
    OPTIONAL_SPLITS,
    REQUIRED_SPLITS,
    expected_files,
    find_files,
    read_lines,
)

_URL = 'https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz'

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
            stem = FILE_STEMS[split][-1]
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
        columns = {lang: read_lines(path) for lang, path in paths.items()}
        counts = {lang: len(lines) for lang, lines in columns.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f'Multi30k files {paths} have different line counts {counts}.')
        for i, pair in enumerate(zip(*columns.values(), strict=True)):
            yield i, dict(zip(columns, pair, strict=True))
