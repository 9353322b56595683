"""Several training corpora in one run, the setting:
``data.mix='NAME=SOURCE[:WEIGHT][:TAG][:PAIR],...'``.

Each entry names a corpus and where its training pairs come from: SOURCE is a folder of text
files in the folder layout (``train.en``, ``train.de``; transformer/data/folder.py) or any name
``data.dataset`` takes (a TFDS dataset, ``multi30k``, ...), read with the run's languages and
``data.train_split``. SOURCE is a folder when it is an existing directory or starts with ``/``,
``./``, ``../`` or ``~``, else a dataset name (``wmt14_translate/de-en``). An entry is read from
the right, so a path holding ``:`` survives: a last part holding ``->`` is its PAIR, then a
last part of reserved-token form (``<bt>``, ``>>de<<``) its TAG, then a last part that is a
number its WEIGHT.

Training batches draw pairs from the entries in proportion to their weights; an entry without
one weighs ``pairs ** (1 / data.mix_temperature)`` over the same sum of all entries (fairseq's
temperature sampling: 1 = proportional to size, larger = flatter), and the weights are then
normalised. A TAG is a reserved piece of the vocabulary (a new vocabulary gets every tag of the
mix as a control piece), put first in each of the entry's sources as its id, never as text
(`source_tag.tag_sources`): tagged back-translation's ``<bt>``, a target language's
``>>de<<``. Validation and test splits come from ``data.dataset`` alone.

A PAIR gives the entry's language codes on a multilingual vocabulary (NLLB-200, M2M100,
mBART-50; language_pair.py), so one run trains several directions: ``SRC->TGT``
(``eng_Latn->deu_Latn``) reads the run's files, ``data.source_lang``'s as sources and
``data.target_lang``'s as targets; ``LANG=SRC->LANG=TGT`` (``de=deu_Latn->en=eng_Latn``) names
the languages of the texts each side reads (file suffix, TFDS key), so the same corpus can be
read the other way round. An entry without one takes ``data.source_lang_code`` /
``data.target_lang_code``. With a TAG too, the source code comes first, then the TAG.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from transformer.data.errors import DataError

NAME = re.compile(r'[A-Za-z0-9_-]{1,32}')
TAG = re.compile(r'<[A-Za-z0-9_.-]{1,32}>|>>[A-Za-z0-9_.-]{1,32}<<')
SIDE = re.compile(r'(?:(?P<lang>[A-Za-z0-9_-]{1,32})=)?(?P<code>[A-Za-z0-9_.-]{1,32})')
FORM = 'NAME=SOURCE[:WEIGHT][:TAG][:PAIR]'
PAIR_FORM = 'SRC->TGT or LANG=SRC->LANG=TGT'


@dataclasses.dataclass(frozen=True)
class EntryPair:
    """A mix entry's language pair: its codes, and the languages of the texts each side
    reads (None: the run's ``data.source_lang`` and ``data.target_lang``)."""

    source_code: str
    target_code: str
    source_lang: str | None = None
    target_lang: str | None = None


@dataclasses.dataclass(frozen=True)
class MixEntry:
    """One corpus of the mix."""

    name: str
    source: str  # a folder path or a data.dataset name
    weight: float | None  # None: set by data.mix_temperature
    tag: str | None  # a reserved token first in each source, or None
    pair: EntryPair | None = None  # its language codes; None: data.source_lang_code's

    @property
    def is_folder(self) -> bool:
        """Whether SOURCE names a folder rather than a dataset: an existing directory, or a
        path that says so (``/``, ``./``, ``../`` or ``~`` first)."""
        explicit = self.source.startswith(('/', './', '../', '~'))
        return explicit or os.path.isdir(self.source)


def parse(mix: str) -> list[MixEntry]:
    """The entries of ``data.mix``, in order.

    Raises:
      DataError: a malformed entry, a name or tag of other characters, a weight that is not
        positive, or a name given twice: one line naming the entry.
    """
    entries, names = [], set()
    for raw in mix.split(','):
        entry = raw.strip()
        name, equals, rest = entry.partition('=')
        if not equals or not rest:
            raise DataError(f'data.mix entry {entry!r} is not of the form {FORM}.')
        if not NAME.fullmatch(name):
            raise DataError(
                f'data.mix entry {entry!r}: its NAME must be 1-32 letters, digits, _ or -.'
            )
        if name in names:
            raise DataError(f'data.mix names {name!r} twice; give each entry its own NAME.')
        names.add(name)
        parts = rest.split(':')
        tag = weight = pair = None
        if len(parts) > 1 and '->' in parts[-1]:
            pair = _pair(parts.pop(), entry)
        if len(parts) > 1 and (parts[-1].startswith('<') or parts[-1].startswith('>>')):
            if not TAG.fullmatch(parts[-1]):
                raise DataError(
                    f'data.mix entry {entry!r}: its TAG {parts[-1]!r} must be <x> or >>x<< with '
                    'x of 1-32 letters, digits, _, . or -.'
                )
            tag = parts.pop()
        if len(parts) > 1 and _number(parts[-1]) is not None:
            weight = _number(parts.pop())
            if not weight > 0 or not math.isfinite(weight):
                raise DataError(f'data.mix entry {entry!r}: its WEIGHT must be a number > 0.')
        source = ':'.join(parts)
        if not source:
            raise DataError(f'data.mix entry {entry!r} names no SOURCE ({FORM}).')
        entries.append(MixEntry(name, source, weight, tag, pair))
    return entries


def _pair(text: str, entry: str) -> EntryPair:
    """The PAIR ``text`` of ``entry`` (module docstring)."""
    sides = [SIDE.fullmatch(side) for side in text.split('->')]
    if len(sides) != 2 or not all(sides):
        raise DataError(
            f'data.mix entry {entry!r}: its PAIR {text!r} must be {PAIR_FORM} (codes and '
            'languages of letters, digits, _, . or -).'
        )
    source, target = sides
    if (source['lang'] is None) != (target['lang'] is None):
        raise DataError(
            f"data.mix entry {entry!r}: its PAIR {text!r} names one side's language: give "
            'LANG= on both sides (LANG=SRC->LANG=TGT) or on neither.'
        )
    return EntryPair(source['code'], target['code'], source['lang'], target['lang'])


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def shares(entries: Sequence[MixEntry], pairs: Sequence[int], temperature: float) -> list[float]:
    """Each entry's share of the training pairs (summing to 1), from its weight or, without
    one, from its number of ``pairs`` and ``temperature`` (module docstring)."""
    scaled = [n ** (1 / temperature) for n in pairs]
    total = sum(scaled)
    weights = [
        e.weight if e.weight is not None else s / total
        for e, s in zip(entries, scaled, strict=True)
    ]
    return [w / sum(weights) for w in weights]


def entry_config(data_config: Any, entry: MixEntry) -> Any:
    """The ``data`` section that reads ``entry``'s corpus: the run's, with its dataset (and
    folder), the languages its PAIR names and without the mix."""
    if entry.is_folder:
        changes = {'dataset': 'folder', 'mix': None}
        own = {'folder': os.path.expanduser(entry.source)}
    else:
        changes, own = {'dataset': entry.source, 'mix': None}, {}
    if entry.pair is not None and entry.pair.source_lang is not None:
        changes.update(source_lang=entry.pair.source_lang, target_lang=entry.pair.target_lang)
    if dataclasses.is_dataclass(data_config):  # a typed DataSection
        return dataclasses.replace(data_config, **changes, sources={**data_config.sources, **own})
    config = data_config.copy_and_resolve_references()  # an ml_collections ConfigDict
    with config.unlocked():
        config.update({**changes, **own})
    return config


def tags(mix: str | None) -> list[str]:
    """The tags of ``data.mix`` (none without one), each once, in order."""
    return list(dict.fromkeys(e.tag for e in parse(mix) if e.tag)) if mix else []


def absolute_folders(mix: str) -> str:
    """``data.mix`` with each folder entry's SOURCE absolute (resolved against the current
    directory, ``~`` expanded; a URL as it is), each entry as written otherwise."""
    written = []
    for raw, entry in zip(mix.split(','), parse(mix), strict=True):
        raw = raw.strip()
        if entry.is_folder and '://' not in entry.source:
            rest = raw.partition('=')[2][len(entry.source) :]  # [:WEIGHT][:TAG][:PAIR]
            raw = f'{entry.name}={os.path.abspath(os.path.expanduser(entry.source))}{rest}'
        written.append(raw)
    return ','.join(written)


def same_but_folders(old: str | None, new: str | None) -> bool:
    """Whether two ``data.mix`` values are the same corpora, weights, tags and pairs, the
    paths of folder entries aside (a resume may move them, as it may move ``data.folder``)."""
    if not old or not new:
        return old == new

    def key(mix: str) -> list[tuple]:
        return [
            (e.name, None if e.is_folder else e.source, e.weight, e.tag, e.pair, e.is_folder)
            for e in parse(mix)
        ]

    return key(old) == key(new)
