"""Token ids of a split, computed once and cached on disk as flat arrays plus offsets.

A cache file ``<cache_dir>/<dataset>-<split>-<key>.npz`` holds the ids of every example of a
split, each side ending with EOS. The key hashes the dataset's identity (name, languages,
synthetic settings, folder file sizes and times, a pretokenization other than 'none'), the
split and the vocabulary file, so a new vocabulary, new data or another preprocessing never
reuse stale ids.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer.data import sources
from transformer.data.pretokenize import Side
from transformer.data.tokenizer import Tokenizer

_ENCODE_CHUNK = 100_000  # sentences per encode call: bounds the memory of Python id lists
_MEMORY_CACHE_SIZE = 4  # recent splits kept in memory (e.g. repeated evaluations)


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
    """Token ids of the examples of a split; example i's source is
    ``source_ids[source_offsets[i]:source_offsets[i + 1]]`` (ending with EOS)."""

    source_ids: np.ndarray  # [total source tokens], uint16 or int32
    source_offsets: np.ndarray  # [N + 1] int64
    target_ids: np.ndarray
    target_offsets: np.ndarray

    @property
    def num_examples(self) -> int:
        return len(self.source_offsets) - 1

    @property
    def source_lengths(self) -> np.ndarray:
        return np.diff(self.source_offsets)

    @property
    def target_lengths(self) -> np.ndarray:
        return np.diff(self.target_offsets)

    def source(self, i: int) -> np.ndarray:
        return self.source_ids[self.source_offsets[i] : self.source_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.target_ids[self.target_offsets[i] : self.target_offsets[i + 1]]


_FIELDS = dataclasses.fields(TokenizedSplit)
_memory_cache: collections.OrderedDict[str, TokenizedSplit] = collections.OrderedDict()


def clear_memory_cache() -> None:
    """Forgets the splits kept in memory (the disk cache stays)."""
    _memory_cache.clear()


def encode_texts(
    tokenizer: Tokenizer, texts: Sequence[str], side: Side = 'source'
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of many texts of one side: flat ids (each text followed by EOS) and offsets
    [N + 1].

    Ids are stored as uint16 when the vocabulary allows, halving the memory of large splits.
    """
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    id_chunks, length_chunks = [], []
    for start in range(0, len(texts), _ENCODE_CHUNK):
        encoded = tokenizer.encode_batch(texts[start : start + _ENCODE_CHUNK], side)
        lengths = np.fromiter((len(ids) + 1 for ids in encoded), np.int64, len(encoded))
        eos = tokenizer.special.eos
        flat = itertools.chain.from_iterable(ids + [eos] for ids in encoded)
        id_chunks.append(np.fromiter(flat, dtype, int(lengths.sum())))
        length_chunks.append(lengths)
    ids = np.concatenate(id_chunks) if id_chunks else np.zeros(0, dtype)
    lengths = np.concatenate(length_chunks) if length_chunks else np.zeros(0, np.int64)
    return ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def cache_key(data_config: Any, tokenizer: Tokenizer, split: str) -> str:
    """The hash that names a split's cache file."""
    identity = {**sources.identity(data_config, split), 'vocab': tokenizer.fingerprint}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cache_dir: str, data_config: Any, tokenizer: Tokenizer, split: str) -> str:
    """The cache file of ``split``: ``<cache_dir>/<dataset>-<split>-<key>.npz``."""
    key = cache_key(data_config, tokenizer, split)
    name = re.sub(r'[^A-Za-z0-9_.-]+', '_', data_config.dataset)
    return os.path.join(cache_dir, f'{name}-{split}-{key}.npz')


def tokenize_split(
    data_config: Any, tokenizer: Tokenizer, split: str, cache_dir: str | None = None
) -> TokenizedSplit:
    """Token ids of a split: from memory, from the disk cache, or tokenized (and cached).

    Args:
      data_config: the ``data`` config section.
      tokenizer: the vocabulary.
      split: the split's name.
      cache_dir: where cache files live; None = tokenize without a disk cache.

    Returns:
      The split's token ids.
    """
    key = cache_key(data_config, tokenizer, split)
    path = cache_path(cache_dir, data_config, tokenizer, split) if cache_dir else None
    data = _memory_cache.pop(key, None)
    if data is not None:
        if path and not os.path.isfile(path):
            _save(path, data)
    elif path and os.path.isfile(path):
        data = load_cache(path, split)
    if data is None:
        source_text, target_text = sources.load_text(data_config, split)
        start = time.perf_counter()
        source_ids, source_offsets = encode_texts(tokenizer, source_text, 'source')
        target_ids, target_offsets = encode_texts(tokenizer, target_text, 'target')
        data = TokenizedSplit(source_ids, source_offsets, target_ids, target_offsets)
        logging.info(
            'Tokenized %d %s examples (%d + %d tokens) in %.1f s.',
            data.num_examples,
            split,
            len(source_ids),
            len(target_ids),
            time.perf_counter() - start,
        )
        if path:
            _save(path, data)
    _memory_cache[key] = data  # most recent last
    while len(_memory_cache) > _MEMORY_CACHE_SIZE:
        _memory_cache.popitem(last=False)
    return data


def load_cache(path: str, split: str) -> TokenizedSplit | None:
    """The cached token ids; None (with a warning) when the file does not read back whole."""
    try:
        with np.load(path) as arrays:
            data = TokenizedSplit(**{field.name: arrays[field.name] for field in _FIELDS})
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        logging.warning('%s does not read back (%s); tokenizing %s again.', path, e, split)
        return None
    logging.info('Loaded %d tokenized %s examples from %s.', data.num_examples, split, path)
    return data


def _save(path: str, data: TokenizedSplit) -> None:
    # Written under a temporary name and renamed: a concurrent reader (another host sharing
    # the directory) sees the whole file or none. A cache that cannot be written (read-only
    # workdir) costs only the tokenizing next time.
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.npz.tmp')
        with os.fdopen(fd, 'wb') as f:
            np.savez(f, **{field.name: getattr(data, field.name) for field in _FIELDS})
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if not isinstance(e, OSError):
            raise
        logging.warning('Could not cache the token ids in %s (%s).', path, e)
        return
    logging.info('Cached the token ids in %s.', path)
