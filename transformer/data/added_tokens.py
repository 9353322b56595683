"""Tokens added to a pretrained vocabulary: a corpus tag such as back-translation's ``<bt>``,
which the pretrained vocabulary lacks.

The syntax (``train.add_tokens``, convert's ``--add_tokens``): a comma-separated list, each
``NAME`` or ``NAME=LIKE``. Each NAME becomes a new piece at the end of the vocabulary, in the
order given: ids V, V+1, ... after every existing piece, in the family's ids and in ours
(the families' mappings keep the last ids last). Its new row of the embedding and of the
output bias is the mean of the existing rows, or, with ``=LIKE``, a copy of the row of the
existing piece LIKE (``'<bt>=<unk>'``).

The run's vocabulary directory holds the tokens in the files Hugging Face reads, as the
family writes them (`transformer.interop.Family.write_vocabulary`).
"""

from __future__ import annotations

from typing import Any

from transformer.data.errors import DataError

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
    tokens and language codes included) or a LIKE that is not one, and for any token where
    the vocabulary says why none can be added (its ``no_added_tokens``)."""
    why = getattr(vocab, 'no_added_tokens', None)
    if added and why:
        raise DataError(f'{key}: {why}')
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
