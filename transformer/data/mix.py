"""Several training corpora as one (``data.mix``; the setting itself: mix_entries.py): one
index space over their examples (`Corpora`), the epochs that draw from them by their shares,
their token stores."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer.data import sources, token_store, tokenized
from transformer.data.errors import DataError
from transformer.data.language_pair import KEYS, has_codes, with_pair
from transformer.data.mix_entries import MixEntry, entry_config, parse, shares
from transformer.data.source_tag import tag_sources
from transformer.data.tokenizer import Tokenizer


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
        return len(kept) if self.shares is None else sum(self._draws(kept))

    def _draws(self, kept: np.ndarray) -> list[int]:
        """With shares: how many examples each part gives an epoch."""
        owned = np.diff(np.searchsorted(kept, self.starts))
        if not owned.all():
            raise DataError(
                f'data.mix entry {self.names[int(np.argmin(owned))]!r} has no training pair '
                'that fits data.max_len.'
            )
        return [max(1, round(share * len(kept))) for share in self.shares]

    def epoch_examples(self, seed: int, epoch: int, kept: np.ndarray) -> np.ndarray:
        """The examples of ``epoch`` in order, from the ``kept`` ones (ascending)."""
        if self.shares is None:
            return np.random.default_rng([seed, epoch]).permutation(kept)
        bounds = np.searchsorted(kept, self.starts)
        draws = []
        for part, count in enumerate(self._draws(kept)):
            own = kept[bounds[part] : bounds[part + 1]]
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

    def pairs(self, rows: Sequence[np.ndarray]) -> dict[str, int]:
        """How many of the examples of ``rows`` each named part holds (empty without names)."""
        if not self.names:
            return {}
        examples = np.concatenate(rows)
        counts = np.bincount(
            np.searchsorted(self.starts, examples, side='right') - 1, minlength=len(self.parts)
        )
        return {name: int(c) for name, c in zip(self.names, counts, strict=True)}


def run_pair(data_config: Any, tokenizer: Any, vocabulary: str = 'the vocabulary') -> Any:
    """``tokenizer`` with the run's language pair (``data.source_lang_code`` /
    ``data.target_lang_code``; `language_pair.with_pair`): what ``data.dataset``'s training
    split without a mix, and its validation split, are read with."""
    codes = [getattr(data_config, key.partition('.')[2], None) for key in KEYS]
    return with_pair(tokenizer, *codes, KEYS, vocabulary)


def _corpora_configs(data_config: Any, tokenizer: Tokenizer) -> list[tuple[str, Any, Any]]:
    """(name, data section, tokenizer with the entry's tag and language pair) of each corpus
    trained on: the entries of ``data.mix``, else ``data.dataset`` alone (named '')."""
    mix = getattr(data_config, 'mix', None)
    run = run_pair(data_config, tokenizer)  # (a multilingual run's pair is checked first)
    if not mix:
        return [('', data_config, run)]
    found = []
    for entry in parse(mix):
        config = entry_config(data_config, entry)
        if entry.tag is None and has_codes(tokenizer):  # its codes say the languages
            tagged = tokenizer
        else:
            key = f'the tag of data.mix entry {entry.name!r}'
            tagged = tag_sources(tokenizer, entry.tag, key=key)
        if entry.pair is None:
            found.append((entry.name, config, run_pair(data_config, tagged)))
            continue
        pair = (entry.pair.source_code, entry.pair.target_code)
        found.append((entry.name, config, with_pair(tagged, *pair, _keys(entry))))
    return found


def _keys(entry: MixEntry) -> tuple[str, str]:
    """How errors name the codes of ``entry``'s PAIR."""
    return (f'data.mix entry {entry.name!r}: source', f'data.mix entry {entry.name!r}: target')


def check_vocabulary(data_config: Any, tokenizer: Tokenizer | None) -> None:
    """A one-line `DataError` for what ``tokenizer`` (None: a joint SentencePiece vocabulary
    the run will make, which gets every tag of the mix) cannot give the corpora trained on:
    a tag of ``data.mix`` it lacks, an entry without one where a MarianMT vocabulary is
    multilingual (`tag_sources`), language codes it lacks or has none of, no pair where it has
    codes (`language_pair.with_pair`); nothing is read."""
    if tokenizer is None:  # no codes: any pair of the run or its entries is refused
        new = "the run's new vocabulary"
        run_pair(data_config, None, new)
        for entry in parse(data_config.mix) if getattr(data_config, 'mix', None) else ():
            if entry.pair is not None:
                pair = (entry.pair.source_code, entry.pair.target_code)
                with_pair(None, *pair, _keys(entry), new)
        return
    _corpora_configs(data_config, tokenizer)


def check_files(data_config: Any) -> None:
    """A one-line `DataError` when a mix entry's training files are missing (where the source
    can tell without reading them); nothing without a mix."""
    if getattr(data_config, 'mix', None):
        for entry in parse(data_config.mix):
            try:
                sources.check_files(entry_config(data_config, entry), [data_config.train_split])
            except DataError as e:
                raise DataError(f'data.mix entry {entry.name!r}: {e}') from None


def prepare_stores(data_config: Any, tokenizer: Tokenizer, cache_dir: str) -> list[str]:
    """The token store of each corpus trained on, built where missing (by one process of a
    multi-host run; the others then open them: `training_corpora`); their paths."""
    return [
        token_store.prepare(config, tagged, cache_dir, data_config.train_split)
        for _, config, tagged in _corpora_configs(data_config, tokenizer)
    ]


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
