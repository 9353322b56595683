"""Several training corpora in one run: ``data.mix='NAME=SOURCE[:WEIGHT][:TAG],...'``.

Each entry names a corpus and where its training pairs come from: SOURCE is a folder of text
files in the folder layout (``train.en``, ``train.de``; transformer/data/folder.py) or any name
``data.dataset`` takes (a TFDS dataset, ``multi30k``, ...), read with the run's languages and
``data.train_split``. SOURCE is a folder when it is an existing directory or starts with ``/``,
``./``, ``../`` or ``~``, else a dataset name (``wmt14_translate/de-en``). An entry is read from
the right, so a path holding ``:`` survives: a last part of reserved-token form (``<bt>``,
``>>de<<``) is its TAG, then a last part that is a number its WEIGHT.

Training batches draw pairs from the entries in proportion to their weights; an entry without
one weighs ``pairs ** (1 / data.mix_temperature)`` over the same sum of all entries (fairseq's
temperature sampling: 1 = proportional to size, larger = flatter), and the weights are then
normalised. A TAG is a reserved piece of the vocabulary (a new vocabulary gets every tag of the
mix as a control piece), put first in each of the entry's sources as its id, never as text
(`source_tag.tag_sources`): tagged back-translation's ``<bt>``, a target language's
``>>de<<``. Validation and test splits come from ``data.dataset`` alone.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer.data import sources, token_store, tokenized
from transformer.data.errors import DataError
from transformer.data.source_tag import tag_sources
from transformer.data.tokenizer import Tokenizer

NAME = re.compile(r'[A-Za-z0-9_-]{1,32}')
TAG = re.compile(r'<[A-Za-z0-9_.-]{1,32}>|>>[A-Za-z0-9_.-]{1,32}<<')
FORM = 'NAME=SOURCE[:WEIGHT][:TAG]'


@dataclasses.dataclass(frozen=True)
class MixEntry:
    """One corpus of the mix."""

    name: str
    source: str  # a folder path or a data.dataset name
    weight: float | None  # None: set by data.mix_temperature
    tag: str | None  # a reserved token first in each source, or None

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
        tag = weight = None
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
        entries.append(MixEntry(name, source, weight, tag))
    return entries


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
    folder) and without the mix."""
    if entry.is_folder:
        changes = {'dataset': 'folder', 'mix': None}
        own = {'folder': os.path.expanduser(entry.source)}
    else:
        changes, own = {'dataset': entry.source, 'mix': None}, {}
    if dataclasses.is_dataclass(data_config):  # a typed DataSection
        return dataclasses.replace(data_config, **changes, sources={**data_config.sources, **own})
    config = data_config.copy_and_resolve_references()  # an ml_collections ConfigDict
    with config.unlocked():
        config.update({**changes, **own})
    return config


def tags(mix: str | None) -> list[str]:
    """The tags of ``data.mix`` (none without one), each once, in order."""
    return list(dict.fromkeys(e.tag for e in parse(mix) if e.tag)) if mix else []


class Corpora:
    """The training examples of one corpus or several, as one index space: part p's example i
    is example ``starts[p] + i``. Offers what packing reads of a `TokenizedSplit` (lengths),
    the examples of each epoch, and each batch's tokens and pairs per part.

    One part without shares is a run's single corpus: its epochs are permutations of its
    examples, drawn from (seed, epoch), as they always were. With shares (a mix), epoch k
    takes ``round(share * examples)`` examples from each part (at least one): the next ones of
    an endless sequence of that part's permutations (drawn from (seed, part, pass)), so a small
    part given a large share is repeated and a large one given a small share is read a slice
    an epoch; then the epoch's examples are shuffled together.
    """

    def __init__(self, parts: Sequence[Any], names: Sequence[str] = (), shares=None):
        self.parts, self.names, self.shares = list(parts), list(names), shares
        sizes = [p.num_examples for p in self.parts]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_examples = int(self.starts[-1])
        for side in ('source', 'target'):
            lengths = [getattr(p, f'{side}_lengths') for p in self.parts]
            setattr(
                self,
                f'{side}_lengths',
                lengths[0] if len(lengths) == 1 else np.concatenate(lengths),
            )

    def epoch_size(self, kept: np.ndarray) -> int:
        """How many examples an epoch has (`epoch_examples`)."""
        if self.shares is None:
            return len(kept)
        empty = [
            name
            for name, a, b in zip(self.names, self.starts[:-1], self.starts[1:], strict=True)
            if not np.any((kept >= a) & (kept < b))
        ]
        if empty:
            raise DataError(
                f'data.mix entry {empty[0]!r} has no training pair that fits data.max_len.'
            )
        return sum(max(1, round(share * len(kept))) for share in self.shares)

    def epoch_examples(self, seed: int, epoch: int, kept: np.ndarray) -> np.ndarray:
        """The examples of ``epoch`` in order, from the ``kept`` ones (ascending)."""
        if self.shares is None:
            return np.random.default_rng([seed, epoch]).permutation(kept)
        bounds = np.searchsorted(kept, self.starts)
        draws = []
        for part, share in enumerate(self.shares):
            own = kept[bounds[part] : bounds[part + 1]]
            count = max(1, round(share * len(kept)))
            first, last = epoch * count, (epoch + 1) * count  # in the part's endless sequence
            for turn in range(first // len(own), (last - 1) // len(own) + 1):
                order = np.random.default_rng([seed, part, turn]).permutation(own)
                base = turn * len(own)
                draws.append(order[max(first - base, 0) : min(last - base, len(own))])
        return np.random.default_rng([seed, epoch]).permutation(np.concatenate(draws))

    def gather(
        self, side: str, examples: np.ndarray, token_example: np.ndarray, within
    ) -> np.ndarray:
        """Token ``within[t]`` of example ``examples[token_example[t]]`` for every t, int32."""
        if len(self.parts) == 1:
            data = self.parts[0]
            ids, offsets = getattr(data, f'{side}_ids'), getattr(data, f'{side}_offsets')
            return ids[offsets[examples].astype(np.int64)[token_example] + within].astype(np.int32)
        part_of = np.searchsorted(self.starts, examples, side='right') - 1
        values = np.empty(len(token_example), np.int32)
        for part in np.unique(part_of):
            data = self.parts[part]
            ids, offsets = getattr(data, f'{side}_ids'), getattr(data, f'{side}_offsets')
            mine = part_of[token_example] == part
            local = examples[token_example[mine]] - self.starts[part]
            values[mine] = ids[offsets[local].astype(np.int64) + within[mine]]
        return values

    def pairs(self, examples: np.ndarray) -> dict[str, int]:
        """How many of ``examples`` each named part holds (empty without names)."""
        if not self.names:
            return {}
        counts = np.bincount(
            np.searchsorted(self.starts, examples, side='right') - 1, minlength=len(self.parts)
        )
        return {name: int(c) for name, c in zip(self.names, counts, strict=True)}


def _corpora_configs(data_config: Any, tokenizer: Tokenizer) -> list[tuple[str, Any, Any]]:
    """(name, data section, tokenizer with the entry's tag) of each corpus trained on: the
    entries of ``data.mix``, else ``data.dataset`` alone (named '')."""
    mix = getattr(data_config, 'mix', None)
    if not mix:
        return [('', data_config, tokenizer)]
    found = []
    for entry in parse(mix):
        config = entry_config(data_config, entry)
        key = f'the tag of data.mix entry {entry.name!r}'
        found.append((entry.name, config, tag_sources(tokenizer, entry.tag, key=key)))
    return found


def check_files(data_config: Any) -> None:
    """A one-line `DataError` when a mix entry's training files are missing (where the source
    can tell without reading them); nothing without a mix."""
    if getattr(data_config, 'mix', None):
        for entry in parse(data_config.mix):
            try:
                sources.check_files(entry_config(data_config, entry), [data_config.train_split])
            except DataError as e:
                raise DataError(f'data.mix entry {entry.name!r}: {e}') from None


def prepare_stores(data_config: Any, tokenizer: Tokenizer, cache_dir: str) -> None:
    """Builds the token store of each corpus trained on where it is missing (one process of a
    multi-host run; the others then open them: `training_corpora`)."""
    for _, config, tagged in _corpora_configs(data_config, tokenizer):
        token_store.prepare(config, tagged, cache_dir, data_config.train_split)


def training_corpora(
    data_config: Any, tokenizer: Tokenizer, cache_dir: str | None, build: bool = True
) -> Corpora:
    """The corpora trained on, each from its token store (built where missing and ``build``
    allows; `token_store.open_prepared`) or, without a ``cache_dir``, tokenized into memory;
    with ``data.mix``, named and given their shares."""
    split = data_config.train_split
    parts, names = [], []
    for name, config, tagged in _corpora_configs(data_config, tokenizer):
        if cache_dir is None:
            parts.append(tokenized.tokenize_split(config, tagged, split))
        else:
            parts.append(token_store.open_prepared(config, tagged, cache_dir, split, build))
        names.append(name)
    if not getattr(data_config, 'mix', None):
        return Corpora(parts)
    entries = parse(data_config.mix)
    counts = [p.num_examples for p in parts]
    weights = shares(entries, counts, float(data_config.mix_temperature))
    return Corpora(parts, names, weights)
