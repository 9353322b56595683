"""Multi30k (WMT16 multimodal translation, task 1), text only, English-German.

29000 training, 1014 validation and 1000 test2016 sentence pairs of image captions (Elliott et
al., 2016). The raw, untokenized, original-case files of the multi30k/dataset GitHub repository
(data/task1/raw/*.gz) are read directly from ``data.manual_dir`` (no network, no
TensorFlow); without them, the TFDS builder in multi30k_tfds.py reads a prepared copy in
``data.data_dir`` or downloads the files. The manual directory may hold the repository's
names, gzipped or not (``train.en.gz``, ``val.de``, ``test_2016_flickr.en`` ...), or the short
names ``train.en``, ``val.en``, ``test2016.en`` ...

Splits: 'train', 'validation', 'test2016', and 'test2017', 'test2018', 'mscoco2017' when their
files are present. Either way examples keep the order of the files: line i of a split is
example i.
"""

from __future__ import annotations

from typing import Any

from absl import logging

from transformer.data import tfds_translate
from transformer.data.errors import DataError
from transformer.data.multi30k_files import (
    LANGUAGES,
    OPTIONAL_SPLITS,
    REQUIRED_SPLITS,
    expected_files,
    find_files,
    read_files,
)

DOWNLOAD_HOST = 'raw.githubusercontent.com'


KEYS: dict = {}  # it reads tfds_translate's: data.manual_dir and data.data_dir


def check(data_config: Any) -> None:
    """Multi30k's languages and splits, before anything is read."""
    tfds_translate.check_languages('multi30k', LANGUAGES, data_config)
    for key in ('train_split', 'eval_split', 'test_split'):
        check_split(data_config, getattr(data_config, key), f'data.{key}')


def check_split(data_config: Any, split: str, key: str = 'split') -> None:
    splits = (*REQUIRED_SPLITS, *OPTIONAL_SPLITS)
    if split not in splits:
        raise DataError(f'multi30k has no split {split!r} ({key}); splits: {list(splits)}.')


def read(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of a split: from the raw files in ``data.manual_dir`` when it holds
    them (no TensorFlow), else through the TFDS builder (prepared copy or download)."""
    tfds_translate.check_languages('multi30k', LANGUAGES, data_config)
    manual_dir = data_config.manual_dir
    files = find_files(manual_dir)
    if set(REQUIRED_SPLITS) <= set(files):
        if split not in files:
            raise DataError(f'multi30k has no split {split!r}; splits: {sorted(files)}.')
        columns = read_files(files[split])
        return columns[data_config.source_lang], columns[data_config.target_lang]
    where = f'data.manual_dir={manual_dir}' if manual_dir else 'data.manual_dir (unset)'
    lacks = (
        f'{where} lacks the raw files {", ".join(expected_files())} (plain or .gz, from '
        'github.com/multi30k/dataset data/task1/raw): put them there'
    )
    try:
        tfds_translate.import_tfds()
    except DataError as e:  # without TFDS, the files are the only way
        raise DataError(f'{lacks}; or, for the TFDS copy: {e}') from None
    from transformer.data.multi30k_tfds import Multi30k

    builder = Multi30k(data_dir=data_config.data_dir, file_format='tfrecord')
    if not builder.is_prepared() and not tfds_translate.download_is_mocked(builder):
        if tfds_translate.network_reachable((DOWNLOAD_HOST,)):
            logging.info('Downloading multi30k into %s.', builder.data_dir)
            builder.download_and_prepare()
        else:
            raise DataError(
                f'Multi30k is not prepared in {builder.data_dir}, there is no network to download '
                f'it, and {lacks}.'
            )
    return tfds_translate.read_builder(builder, split, data_config)


def identity(data_config: Any, split: str) -> dict[str, Any]:
    return {}
