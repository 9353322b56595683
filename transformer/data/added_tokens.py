"""Tokens added to a pretrained (MarianMT) vocabulary: a corpus tag such as back-translation's
``<bt>``, which the pretrained vocabulary lacks.

The syntax (``train.add_tokens``, convert's ``--add_tokens``): a comma-separated list, each
``NAME`` or ``NAME=LIKE``. Each NAME becomes a new piece at the end of the vocabulary, in the
order given: Marian's ids V, V+1, ... after every existing piece (whatever the layout) and
ours V, V+1, ... (the permutation of `MarianVocabulary` keeps the last Marian ids last). Its
new row of the embedding and of the output bias is the mean of the existing rows, or, with
``=LIKE``, a copy of the row of the existing piece LIKE (``'<bt>=<unk>'``).

The run's vocabulary directory holds the tokens in the files Hugging Face reads: vocab.json
gets the new pieces, and tokenizer_config.json's ``added_tokens_decoder`` registers each as a
special token, so MarianTokenizer cuts it out of the text and maps it to its id wherever it
stands (and `MarianVocabulary.encode` does the same); decoding drops it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformer.data.errors import DataError

ADDED_KEY = 'added_tokens_decoder'  # tokenizer_config.json's, as transformers writes it
_FORBIDDEN = ',= \t\n'


def parse(spec: str | None, key: str = 'train.add_tokens') -> list[tuple[str, str | None]]:
    """(NAME, LIKE or None) of each entry of ``spec`` (module docstring); [] for None or ''.

    Raises:
      DataError: an empty or malformed entry, a name given twice; one line naming ``key``.
    """
    if not spec:
        return []
    found: list[tuple[str, str | None]] = []
    for entry in spec.split(','):
        name, eq, like = entry.strip().partition('=')
        bad = [c for c in name + like if c in _FORBIDDEN]
        if not name or (eq and not like) or bad:
            raise DataError(
                f'{key}={spec!r}: {entry!r} is not NAME or NAME=LIKE (a token without spaces, '
                "commas or '='), e.g. '<bt>,<ft>=<unk>'."
            )
        if name in (n for n, _ in found):
            raise DataError(f'{key}={spec!r} names {name!r} twice.')
        found.append((name, like or None))
    return found


def check(vocab: Any, added: list[tuple[str, str | None]], key: str) -> None:
    """A one-line `DataError` for a NAME that is already a piece of ``vocab`` (its special
    tokens and language codes included) or a LIKE that is not one."""
    for name, like in added:
        if vocab.token_id(name) is not None:
            raise DataError(
                f'{key}: {name!r} is already a token of the vocabulary (id '
                f'{vocab.token_id(name)}); a new token needs a name of its own.'
            )
        if like is not None and vocab.token_id(like) is None:
            raise DataError(f'{key}: {name}={like}: {like!r} is not a token of the vocabulary.')


def like_ids(vocab: Any, added: list[tuple[str, str | None]]) -> list[int | None]:
    """Our id of each new token's LIKE (None: the mean of the rows)."""
    return [None if like is None else vocab.token_id(like) for _, like in added]


def write(vocab: Any, added: list[tuple[str, str | None]], directory: str) -> None:
    """``vocab``'s files (a `MarianVocabulary`) written into ``directory`` (existing, empty)
    with ``added`` (checked by `check`) at the end of vocab.json and registered in
    tokenizer_config.json (module docstring)."""
    vocab.copy_to(directory)
    path = os.path.join(directory, 'vocab.json')
    with open(path, encoding='utf-8') as f:
        pieces = json.load(f)
    config_path = os.path.join(directory, 'tokenizer_config.json')
    config: dict[str, Any] = {'tokenizer_class': 'MarianTokenizer'}
    if os.path.isfile(config_path):
        with open(config_path, encoding='utf-8') as f:
            config = json.load(f)
    registered = dict(config.get(ADDED_KEY) or {})
    for name, _ in added:
        registered[str(len(pieces))] = {
            'content': name,
            'lstrip': False,
            'normalized': False,
            'rstrip': False,
            'single_word': False,
            'special': True,
        }
        pieces[name] = len(pieces)
    config[ADDED_KEY] = registered
    for file, value in ((path, pieces), (config_path, config)):
        with open(file, 'w', encoding='utf-8') as f:
            json.dump(value, f, indent=2, ensure_ascii=False)
            f.write('\n')


def registered(config: dict[str, Any]) -> list[str]:
    """The tokens tokenizer_config.json (``config``) registers as added (`ADDED_KEY`)."""
    entries = config.get(ADDED_KEY) or {}
    if not isinstance(entries, dict):
        return []
    return [e.get('content') if isinstance(e, dict) else e for e in entries.values()]
