"""Any TFDS translation dataset, e.g. ``'wmt14_translate/de-en'``.

WMT14 splits are 'train', 'validation' (newstest2013) and 'test' (newstest2014). TFDS keys the
text by language code, so either direction is a matter of ``data.source_lang`` /
``data.target_lang``. A dataset that is not prepared and cannot be downloaded (no network)
fails within seconds with one line saying how to provide it, never with minutes of retries.
"""

from __future__ import annotations

import difflib
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from absl import logging

from transformer.data.errors import DataError

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

# Hosts that downloads of TFDS translation datasets need (prepared copies on GCS, raw WMT data).
_TFDS_HOSTS = ('storage.googleapis.com', 'www.statmt.org')
_PROBE_TIMEOUT_S = 3.0


# Its keys in the ``data`` section: (default, type, one-line description).
KEYS = {
    'data_dir': (None, str, "TFDS's data_dir; None = TFDS's default"),
    'manual_dir': (None, str, "the raw files (multi30k's, or a TFDS dataset's manual download)"),
}


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


# How to get tensorflow-datasets, for the lines that need it.
INSTALL = "pip install 'transformer[tfds]' (from a checkout: pip install -e '.[tfds]')"


def import_tfds():
    """tensorflow_datasets (and with it TensorFlow), imported only when a TFDS dataset is read.

    Raises:
      DataError: it is not installed (the ``tfds`` extra).
    """
    try:
        import tensorflow_datasets
    except ImportError:
        raise DataError(f'Reading a TFDS dataset needs tensorflow-datasets: {INSTALL}.') from None
    return tensorflow_datasets


def registered(name: str) -> bool | None:
    """Whether TFDS has a builder for the dataset ``name`` (``'wmt14_translate/de-en'``,
    ``'wmt14_translate:1.0.0'``), by its registry of the builders it ships
    (``tfds.list_builders``: no network, nothing downloaded). True also for a community
    namespace (``'ns:name'``), which only TFDS can look up; None without tensorflow-datasets."""
    try:
        tfds = import_tfds()
    except DataError:
        return None
    base, _, after = name.partition('/')[0].partition(':')
    if after and not after[:1].isdigit():
        return True  # 'namespace:name': TFDS finds it when it builds
    return base in tfds.list_builders(with_community_datasets=False)


def close_name(name: str) -> str | None:
    """The registered TFDS dataset nearest ``name`` (its builder part replaced), if one is near:
    a typo's, not a word's (cutoff 0.8: 'no_such_dataset' is not 'math_dataset')."""
    tfds = import_tfds()
    base = name.partition('/')[0].partition(':')[0]
    names = tfds.list_builders(with_community_datasets=False)
    close = difflib.get_close_matches(base, names, n=1, cutoff=0.8)
    return close[0] + name[len(base) :] if close else None


def download_is_mocked(builder: tfds.core.DatasetBuilder) -> bool:
    """Whether ``download_and_prepare`` was replaced, as ``tfds.testing.mock_data`` does.

    Mocked builders neither download nor need prepared files (``as_dataset`` generates
    examples), so the offline check must not fire for them.
    """
    method = type(builder).download_and_prepare
    return getattr(method, '__module__', '').startswith('tensorflow_datasets.testing')


def check_languages(name: str, languages: tuple[str, ...], data_config: Any) -> None:
    for key in ('source_lang', 'target_lang'):
        if getattr(data_config, key) not in languages:
            raise DataError(
                f'{name} has no language {getattr(data_config, key)!r} (data.{key}); '
                f'its languages are {list(languages)}.'
            )


def official_keys(builder: tfds.core.DatasetBuilder, split: str, n: int) -> list[str] | None:
    """The generator keys of a split's ``n`` examples in file order, where they are known.

    TFDS's WMT builders (tensorflow_datasets/translate/wmt.py) key sentence i of file f of a
    test set as ``'<test set>/<f>/<i>'``; a validation or test split made of one test set
    (newstest2013, newstest2014) whose one file pair has no empty line therefore has the keys
    ``'<test set>/0/0' ... '<test set>/0/<n-1>'``. Other builders: unknown (None).
    """
    subsets = getattr(builder, 'subsets', None)
    names = subsets.get(split, []) if isinstance(subsets, dict) else []
    if len(names) != 1:
        return None
    return [f'{names[0]}/0/{i}' for i in range(n)]


def stored_to_official(builder: tfds.core.DatasetBuilder, split: str, n: int) -> list[int] | None:
    """For each stored example, its index in the original files (None: not recoverable).

    TFDS writes a shuffled split sorted by the md5 hash of (split name, example key)
    (tensorflow_datasets/core/hashing.py, the "S3" format of every 1.x+ WMT version), so
    with the keys known, sorting them by that hash gives the stored order.
    """
    if builder.info.disable_shuffling or download_is_mocked(builder):
        return list(range(n))
    keys = official_keys(builder, split, n)
    if keys is None:
        return None
    from tensorflow_datasets.core import hashing

    hasher = hashing.Hasher(split)
    hashes = [hasher.hash_key(key) for key in keys]
    return sorted(range(n), key=hashes.__getitem__)


def _unordered_note(name: str, split: str) -> str:
    return (
        f'TFDS stores {name} {split} shuffled and its original order cannot be recovered: '
        'outputs follow the stored order (--max_examples takes a hashed subset); the scores '
        "pair each hypothesis with its own row's reference, but do not score the hypotheses "
        'against the official reference file.'
    )


def read_builder(
    builder: tfds.core.DatasetBuilder, split: str, data_config: Any
) -> tuple[list[str], list[str]]:
    """Reads a split of a prepared (or mocked) builder, in the original files' order where
    that can be recovered (`stored_to_official`), else in the stored order."""
    tfds = import_tfds()
    _check_stored_split(builder, split)
    # Batched reading: one tf.data element per sentence pair would be ~10x slower.
    dataset = builder.as_dataset(split=split, shuffle_files=False).batch(4096)
    sources, targets = [], []
    for batch in tfds.as_numpy(dataset):
        sources += [s.decode('utf-8') for s in batch[data_config.source_lang]]
        targets += [t.decode('utf-8') for t in batch[data_config.target_lang]]
    positions = stored_to_official(builder, split, len(sources))
    if positions is None:
        if split != data_config.train_split:
            logging.warning(_unordered_note(builder.name, split))
        return sources, targets
    official_sources, official_targets = [''] * len(sources), [''] * len(targets)
    for stored, official in enumerate(positions):
        official_sources[official] = sources[stored]
        official_targets[official] = targets[stored]
    return official_sources, official_targets


def _check_stored_split(builder: tfds.core.DatasetBuilder, split: str) -> None:
    splits = list(builder.info.splits)
    if splits and split not in splits:
        raise DataError(f'{builder.name} has no split {split!r}; splits: {sorted(splits)}.')


def read_chunks(data_config: Any, split: str, size: int) -> Iterator[tuple[list[str], list[str]]]:
    """`read`'s pairs ``size`` at a time. A split stored in an order that `read` puts back
    (an evaluation split of one test set: small) is read whole first; any other streams."""
    builder = _prepared(data_config)
    _check_stored_split(builder, split)
    stored = builder.info.splits[split].num_examples if split in builder.info.splits else 0
    if stored_to_official(builder, split, stored) is not None:
        sources, targets = read_builder(builder, split, data_config)
        for start in range(0, len(sources), size):
            yield sources[start : start + size], targets[start : start + size]
        return
    tfds = import_tfds()
    dataset = builder.as_dataset(split=split, shuffle_files=False).batch(size)
    for batch in tfds.as_numpy(dataset):
        yield (
            [s.decode('utf-8') for s in batch[data_config.source_lang]],
            [t.decode('utf-8') for t in batch[data_config.target_lang]],
        )


def _builder(data_config: Any) -> tfds.core.DatasetBuilder:
    name = data_config.dataset
    tfds = import_tfds()
    try:
        return tfds.builder(name, data_dir=data_config.data_dir)
    except tfds.core.registered.DatasetNotFoundError:  # a namespace's (`registered`)
        raise DataError(f'TFDS finds no dataset {name!r} (data.dataset).') from None
    except ValueError as e:  # e.g. an unknown builder config such as 'wmt14_translate/xx-en'
        raise DataError(f'Cannot build TFDS dataset {name!r}: {str(e).splitlines()[0]}') from None


def known_splits(builder: tfds.core.DatasetBuilder) -> list[str] | None:
    """The splits of a dataset where they are known without network and without reading an
    example: those of a prepared builder (its dataset_info.json), else those a builder such as
    TFDS's WMT ones declares before it is prepared (``subsets``: split -> its test sets);
    None when neither says (the split is then checked when it is read)."""
    splits = list(builder.info.splits) if builder.is_prepared() else []
    subsets = getattr(builder, 'subsets', None)
    if not splits and isinstance(subsets, dict):
        splits = list(subsets)
    return sorted(map(str, splits)) or None


def check_split(data_config: Any, split: str, key: str = 'split') -> None:
    """A split the dataset lacks, in one line naming ``key`` and its splits (`known_splits`).

    Unlike the other sources' checks this imports TensorFlow and reads the dataset's
    metadata, so commands call it before they read the data (training's config check,
    evaluate), not when any config is parsed; without tensorflow_datasets it says nothing
    (reading the split then says how to install it).
    """
    check_dataset(data_config, {key: split})


def check_dataset(data_config: Any, splits: dict[str, str] | None = None) -> None:
    """The languages and the split keys (``{key: split}``; default: data.train_split,
    eval_split and test_split) against what the dataset has, where that is known without
    network and without reading an example; the first that it lacks is a one-line
    `DataError`. Training calls it before it writes anything (see `check_split`)."""
    try:
        import_tfds()
    except DataError:
        return
    builder = _builder(data_config)
    name = data_config.dataset
    languages = tuple(getattr(builder.info.features, 'languages', ()) or builder.info.features)
    check_languages(name, languages, data_config)
    if splits is None:
        keys = ('train_split', 'eval_split', 'test_split')
        splits = {f'data.{key}': getattr(data_config, key) for key in keys}
    known = known_splits(builder)
    for key, split in splits.items():
        if known is not None and split not in known:
            raise DataError(f'{name} has no split {split!r} ({key}); splits: {known}.')


def read(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of a split of the TFDS dataset ``data.dataset``."""
    return read_builder(_prepared(data_config), split, data_config)


def _prepared(data_config: Any) -> tfds.core.DatasetBuilder:
    """The builder of ``data.dataset``, downloaded and prepared first where it is not."""
    name = data_config.dataset
    tfds = import_tfds()
    builder = _builder(data_config)
    languages = tuple(getattr(builder.info.features, 'languages', ()) or builder.info.features)
    check_languages(name, languages, data_config)
    if not builder.is_prepared() and not download_is_mocked(builder):
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
    return builder


def order_note(data_config: Any, split: str) -> str | None:
    """None when ``read`` gives the split in its original order, else why not."""
    builder = _builder(data_config)
    n = builder.info.splits[split].num_examples if split in builder.info.splits else 0
    if stored_to_official(builder, split, n) is not None:
        return None
    return _unordered_note(builder.name, split)


def identity(data_config: Any, split: str) -> dict[str, Any]:
    # Token ids cached before evaluation splits were put back in file order must not be reused.
    return {'order': 'files'}
