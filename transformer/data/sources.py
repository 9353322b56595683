"""Raw parallel text from the configured source: TFDS, Multi30k, a folder, or the synthetic task.

``data.dataset`` selects the source:

- ``'synthetic'``: the built-in invented language pair (transformer/data/synthetic.py); needs
  no files and no network. ``source_lang`` / ``target_lang`` are ignored.
- ``'multi30k'``: Multi30k en-de through the TFDS builder in transformer/data/multi30k.py,
  prepared from ``data.manual_dir`` when it holds the raw files, else downloaded.
- ``'folder'``: aligned text files in ``data.folder``, one sentence a line, named
  ``{split}.{lang}`` (``train.en``, ``train.de``) or ``{lang}.{split}.txt`` as TFDS
  ``TranslateFolder`` names them.
- any TFDS translation dataset, e.g. ``'wmt14_translate/de-en'`` (splits 'train',
  'validation' = newstest2013, 'test' = newstest2014) or ``'wmt17_translate/de-en'``. TFDS
  keys the text by language code, so either direction is a matter of ``source_lang`` /
  ``target_lang``.

A dataset that cannot be read fails at once with a one-line ``DataError`` saying how to
provide it, never with minutes of download retries on a machine without network.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from transformer.data import multi30k, synthetic

# Hosts that downloads of TFDS translation datasets need (prepared copies on GCS, raw WMT data).
_TFDS_HOSTS = ('storage.googleapis.com', 'www.statmt.org')
_PROBE_TIMEOUT_S = 3.0


class DataError(ValueError):
    """A dataset cannot be read; the one-line message says how to provide it."""


def network_reachable(hosts: tuple[str, ...], timeout: float = _PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to port 443 of any of ``hosts`` opens within ``timeout`` s.

    Name resolution can block far longer than a socket timeout on a machine without network,
    so the probe runs in a daemon thread that is abandoned when the time is up.
    """
    reachable = threading.Event()

    def probe(host):
        try:
            with socket.create_connection((host, 443), timeout=timeout):
                reachable.set()
        except OSError:
            pass

    threads = [threading.Thread(target=probe, args=(host,), daemon=True) for host in hosts]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if reachable.is_set():
            return True
    return reachable.is_set()


def _download_is_mocked(builder: tfds.core.DatasetBuilder) -> bool:
    """Whether ``download_and_prepare`` was replaced, as ``tfds.testing.mock_data`` does.

    Mocked builders neither download nor need prepared files (``as_dataset`` generates
    examples), so the offline check must not fire for them.
    """
    method = type(builder).download_and_prepare
    return getattr(method, '__module__', '').startswith('tensorflow_datasets.testing')


def load_text(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """All raw source and target sentences of a split, aligned, in the dataset's order.

    Args:
      data_config: the ``data`` config section.
      split: a split of the dataset ('train', 'validation', 'test', 'test2016' ...).

    Returns:
      (sources, targets): untokenized, original-case sentences.

    Raises:
      DataError: the dataset, split or language is unknown, or the data are missing and
        cannot be downloaded.
    """
    name = data_config.dataset
    start = time.perf_counter()
    if name == 'synthetic':
        if split not in synthetic.SPLITS:
            raise DataError(
                f'The synthetic dataset has no split {split!r}; splits: {list(synthetic.SPLITS)}.'
            )
        sources, targets = synthetic.load_text(data_config.synthetic, split)
    elif name == 'folder':
        sources, targets = _load_folder(data_config, split)
    elif name == 'multi30k':
        sources, targets = _load_multi30k(data_config, split)
    else:
        sources, targets = _load_tfds(data_config, split)
    logging.info(
        'Loaded %d %s pairs of %s in %.1f s.',
        len(sources),
        split,
        name,
        time.perf_counter() - start,
    )
    return sources, targets


def _read_lines(path: epath.Path) -> list[str]:
    # split('\n'), not splitlines(): sentences may contain other Unicode line separators.
    lines = path.read_text(encoding='utf-8').split('\n')
    if lines and not lines[-1]:
        lines.pop()
    return [line.rstrip('\r') for line in lines]


def folder_files(folder: epath.PathLike, split: str, lang: str) -> list[epath.Path]:
    """The candidate paths of one side of a split in a folder, in order of preference."""
    root = epath.Path(folder)
    return [root / f'{split}.{lang}', root / f'{lang}.{split}.txt']


def _load_folder(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    if not data_config.folder:
        raise DataError("dataset='folder' needs data.folder, the directory of the text files.")
    columns = []
    for lang in (data_config.source_lang, data_config.target_lang):
        candidates = folder_files(data_config.folder, split, lang)
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise DataError(
                f'Missing file for split {split!r} ({lang}): expected '
                f'{" or ".join(map(str, candidates))}.'
            )
        columns.append(_read_lines(path))
    sources, targets = columns
    if len(sources) != len(targets):
        raise DataError(
            f'Split {split!r} in {data_config.folder} has {len(sources)} '
            f'{data_config.source_lang} but {len(targets)} {data_config.target_lang} lines; '
            'the files must be aligned line by line.'
        )
    return sources, targets


def _check_languages(name: str, languages: tuple[str, ...], data_config: Any) -> None:
    for key in ('source_lang', 'target_lang'):
        if data_config[key] not in languages:
            raise DataError(
                f'{name} has no language {data_config[key]!r} (data.{key}); '
                f'its languages are {list(languages)}.'
            )


def _read_builder(
    builder: tfds.core.DatasetBuilder, split: str, data_config: Any
) -> tuple[list[str], list[str]]:
    """Reads a split of a prepared (or mocked) builder in its stored order."""
    splits = list(builder.info.splits)
    if splits and split not in splits:
        raise DataError(f'{builder.name} has no split {split!r}; splits: {sorted(splits)}.')
    # Batched reading: one tf.data element per sentence pair would be ~10x slower.
    dataset = builder.as_dataset(split=split, shuffle_files=False).batch(4096)
    sources, targets = [], []
    for batch in tfds.as_numpy(dataset):
        sources += [s.decode('utf-8') for s in batch[data_config.source_lang]]
        targets += [t.decode('utf-8') for t in batch[data_config.target_lang]]
    return sources, targets


def _load_tfds(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    name = data_config.dataset
    try:
        builder = tfds.builder(name, data_dir=data_config.data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise DataError(
            f"Unknown dataset {name!r}: use 'synthetic', 'multi30k', 'folder' or a TFDS "
            "translation dataset such as 'wmt14_translate/de-en'."
        ) from None
    except ValueError as e:  # e.g. an unknown builder config such as 'wmt14_translate/xx-en'
        raise DataError(f'Cannot build TFDS dataset {name!r}: {str(e).splitlines()[0]}') from None
    languages = tuple(getattr(builder.info.features, 'languages', ()) or builder.info.features)
    _check_languages(name, languages, data_config)
    if not builder.is_prepared() and not _download_is_mocked(builder):
        if not network_reachable(_TFDS_HOSTS):
            raise DataError(
                f'{name} is not prepared in {builder.data_dir} and there is no network to '
                f'download it: run `tfds build {name} --data_dir=DIR` where there is, copy DIR '
                'here and set data.data_dir=DIR.'
            )
        logging.info('Downloading and preparing %s into %s.', name, builder.data_dir)
        download_config = None
        if data_config.manual_dir:
            download_config = tfds.download.DownloadConfig(manual_dir=data_config.manual_dir)
        builder.download_and_prepare(download_config=download_config)
    return _read_builder(builder, split, data_config)


def _load_multi30k(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    _check_languages('multi30k', multi30k.LANGUAGES, data_config)
    builder = multi30k.Multi30k(data_dir=data_config.data_dir, file_format='tfrecord')
    if not builder.is_prepared() and not _download_is_mocked(builder):
        manual_dir = data_config.manual_dir
        if multi30k.has_manual_files(manual_dir):
            logging.info('Preparing multi30k from %s into %s.', manual_dir, builder.data_dir)
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(manual_dir=os.fspath(manual_dir))
            )
        elif network_reachable((multi30k.DOWNLOAD_HOST,)):
            logging.info('Downloading multi30k into %s.', builder.data_dir)
            builder.download_and_prepare()
        else:
            where = f'data.manual_dir={manual_dir}' if manual_dir else 'data.manual_dir (unset)'
            raise DataError(
                f'Multi30k is not prepared in {builder.data_dir}, there is no network to download '
                f'it, and {where} lacks the raw files {", ".join(multi30k.expected_files())} '
                '(plain or .gz, from github.com/multi30k/dataset data/task1/raw): put them there.'
            )
    return _read_builder(builder, split, data_config)
