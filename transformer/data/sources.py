"""Raw parallel text from the configured source, through one registry of data sources.

``data.dataset`` names the source; each is one module with the same three functions:

- ``read(data_config, split) -> (sources, targets)``: raw, aligned, original-case sentences
  in the dataset's order, or a one-line `DataError` saying how to provide them;
- ``identity(data_config, split) -> dict``: what besides the name, languages and split
  decides its content (part of the token-cache key);
- ``KEYS``: the keys of the ``data`` config section it alone reads (dotted below ``data``)
  -> (default, type, one-line description): the schema adds them to the config, ``--help``
  prints the descriptions;
- optionally ``read_chunks(data_config, split, size)``: the pairs ``read`` gives, ``size`` at
  a time, without holding the split (a corpus larger than memory);
- optionally ``order_note(data_config, split) -> str | None``: why ``read`` cannot give the
  dataset's original order (TFDS datasets stored shuffled), None when it does;
- optionally ``check(data_config)``: a one-line `DataError` naming the key whose value this
  source cannot use (a split it does not have, a count or a limit that cannot work), from
  the values alone, without reading anything: the config's schema calls it when a config
  is parsed, before a command writes anything;
- optionally ``check_split(data_config, split)``: the same for one split a command names;
- optionally ``check_files(data_config, splits)``: whether the files of those splits are
  there, where that is cheap to know (training asks before it writes anything);
- optionally ``check_dataset(data_config)``: what ``check`` cannot tell from the values
  alone, such as the splits and languages of a TFDS dataset (its metadata, which needs
  TensorFlow: no config parse should import it); training asks before it writes anything.

Registered: ``'synthetic'`` (the built-in invented language pair, transformer/data/
synthetic.py; no files, no network), ``'multi30k'`` (multi30k.py), ``'folder'`` (folder.py),
``'none'`` (no_dataset.py: a run that names no dataset);
any other name is a TFDS translation dataset (tfds_translate.py), and a name that TFDS does not
register either stops in one line before anything is read. A new dataset is one module
plus one line in `SOURCES`. Only reading a TFDS dataset imports tensorflow_datasets (and
TensorFlow); the other sources, and Multi30k from raw files, never do.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from absl import logging

from transformer.data import folder, multi30k, no_dataset, synthetic, tfds_translate
from transformer.data.errors import DataError

SOURCES: dict[str, ModuleType] = {
    'synthetic': synthetic,
    'multi30k': multi30k,
    'folder': folder,
    'none': no_dataset,
}
TFDS = tfds_translate  # every other ``data.dataset`` name
CHUNK_PAIRS = 100_000  # pairs a streaming reader holds at once (`read_chunks`)
__all__ = [
    'SOURCES',
    'DataError',
    'check',
    'check_dataset',
    'check_files',
    'check_split',
    'identity',
    'load_text',
    'read_chunks',
    'order_note',
    'own_keys',
    'source',
]


def source(name: str) -> ModuleType:
    """The module that reads ``data.dataset == name``."""
    return SOURCES.get(name, TFDS)


def own_keys() -> dict[str, tuple[Any, type, str]]:
    """Every source's own keys (dotted below ``data``) -> (default, type, description)."""
    found = {}
    for module in (*SOURCES.values(), TFDS):
        found |= module.KEYS
    return found


def load_text(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """All raw source and target sentences of a split, aligned, in the dataset's order.

    Raises:
      DataError: the dataset, split or language is unknown, or the data are missing and
        cannot be downloaded.
    """
    start = time.perf_counter()
    _check_name(data_config.dataset, reading=True)
    sources, targets = source(data_config.dataset).read(data_config, split)
    logging.info(
        'Loaded %d %s pairs of %s in %.1f s.',
        len(sources),
        split,
        data_config.dataset,
        time.perf_counter() - start,
    )
    return sources, targets


def read_chunks(
    data_config: Any, split: str, size: int | None = None
) -> Iterator[tuple[list[str], list[str]]]:
    """The split's pairs as `load_text` gives them, ``size`` (default `CHUNK_PAIRS`) at a
    time: a source with its own ``read_chunks`` (a folder, a TFDS dataset) streams them, in
    the memory of one chunk; the others (synthetic, Multi30k: small by nature) are read whole
    and cut."""
    size = size or CHUNK_PAIRS
    _check_name(data_config.dataset, reading=True)
    reader = getattr(source(data_config.dataset), 'read_chunks', None)
    if reader is not None:
        yield from reader(data_config, split, size)
        return
    sources, targets = source(data_config.dataset).read(data_config, split)
    for start in range(0, len(sources), size):
        yield sources[start : start + size], targets[start : start + size]


def identity(data_config: Any, split: str) -> dict[str, Any]:
    """Everything that decides the text of a split (the token cache is keyed by it); the
    pretokenization only when it is not 'none', so the keys of raw-text runs stay as they
    were."""
    found = {
        'dataset': data_config.dataset,
        'source_lang': data_config.source_lang,
        'target_lang': data_config.target_lang,
        'split': split,
        **source(data_config.dataset).identity(data_config, split),
    }
    if data_config.pretokenize != 'none':
        found['pretokenize'] = data_config.pretokenize
    return found


def order_note(data_config: Any, split: str) -> str | None:
    """None when `load_text` gives the split in the dataset's original order, else why not."""
    note = getattr(source(data_config.dataset), 'order_note', None)
    return note(data_config, split) if note is not None else None


def check(data_config: Any) -> None:
    """A one-line `DataError` naming the first source key (or split) whose value the source of
    ``data.dataset`` cannot use; reads nothing."""
    checker = getattr(source(data_config.dataset), 'check', None)
    if checker is not None:
        checker(data_config)


def check_split(data_config: Any, split: str) -> None:
    """A one-line `DataError` when the source has no split ``split`` (where it knows its
    splits without reading anything)."""
    checker = getattr(source(data_config.dataset), 'check_split', None)
    if checker is not None:
        checker(data_config, split)


def check_files(data_config: Any, splits: Sequence[str]) -> None:
    """A one-line `DataError` when the files of ``splits`` are missing, where the source
    can tell without reading them (a folder of text files); others answer when read."""
    checker = getattr(source(data_config.dataset), 'check_files', None)
    if checker is not None:
        checker(data_config, splits)


def check_dataset(data_config: Any) -> None:
    """A one-line `DataError` naming the first split key or language the dataset lacks, where
    the source can tell without network and without reading an example (a TFDS dataset's
    metadata); may import TensorFlow, so only commands about to read the data ask."""
    _check_name(data_config.dataset, reading=False)
    checker = getattr(source(data_config.dataset), 'check_dataset', None)
    if checker is not None:
        checker(data_config)


def _check_name(name: str, reading: bool) -> None:
    """A one-line `DataError` for a ``data.dataset`` that is none of `SOURCES` nor a TFDS
    dataset by TFDS's registry (`tfds_translate.registered`: no network). Without
    tensorflow-datasets that cannot be told: only a read (``reading``), which needs it, stops."""
    known = name in SOURCES or TFDS.registered(name)
    if known or (known is None and not reading):
        return
    head = f'data.dataset={name!r} is not a source of this package ({", ".join(SOURCES)}) nor'
    close = difflib.get_close_matches(name, list(SOURCES), n=1)
    if known is None:
        hint = f'did you mean {close[0]!r}? To read a TFDS dataset, ' if close else 'to read one, '
        raise DataError(
            f'{head}, as far as can be told without tensorflow-datasets, a TFDS dataset: '
            f'{hint}{TFDS.INSTALL}.'
        )
    close = close or [c for c in [TFDS.close_name(name)] if c]
    hint = (
        f'did you mean {close[0]!r}?' if close else "TFDS's are named like 'wmt14_translate/de-en'."
    )
    raise DataError(f'{head} a TFDS dataset: {hint}')
