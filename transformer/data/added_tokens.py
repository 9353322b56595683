"""Tokens added to a pretrained vocabulary: a corpus tag such as back-translation's ``<bt>``,
or a language code the model lacks, which the pretrained vocabulary lacks.

The syntax (``train.add_tokens``, convert's ``--add_tokens``): a comma-separated list, each
``NAME`` or ``NAME=LIKE``. Each NAME becomes a new piece at the end of the vocabulary, in the
order given: ids V, V+1, ... after every existing piece, in the family's ids and in ours
(the families' mappings keep the last ids last). Its new row of the embedding and of the
output bias is the mean of the existing rows, or, with ``=LIKE``, a copy of the row of the
existing piece LIKE (``'<bt>=<unk>'``).

A new language code: on a vocabulary with language codes (NLLB-200, M2M100, mBART-50), a
NAME of the shape of its codes (its ``shaped_as_code``: NLLB-200's ``xxx_Xxxx``, M2M100's
``__xx__``, mBART-50's ``xx_XX``) is a code like the others (its ``language_tokens`` list it,
so the language options and the mix take it). Its row is LIKE's, which must be a code (a
related language's: ``'xyz_Latn=deu_Latn'``), or without LIKE the mean of the codes' rows
(not of all rows: a code's row is where the model reads which language to write). A LIKE
that is a code for a NAME of another shape is refused, since that NAME would be no code.

The run's vocabulary directory holds the tokens in the files Hugging Face reads, as the
family writes them (`transformer.interop.Family.write_vocabulary`).
"""

from __future__ import annotations

from typing import Any

from transformer.data.errors import DataError
from transformer.data.language_pair import few_codes, has_codes

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
        _check_code(vocab, name, like, key)


def _is_code(vocab: Any, name: str) -> bool:
    """Whether ``name``, added to ``vocab``, is a new language code (module docstring)."""
    shaped = getattr(vocab, 'shaped_as_code', None)  # a vocabulary with codes says their shape
    return has_codes(vocab) and shaped is not None and shaped(name)


def _check_code(vocab: Any, name: str, like: str | None, key: str) -> None:
    """A one-line `DataError` for a code made from a row that is no code's, or a token of
    another shape made from a code's."""
    if not has_codes(vocab) or like is None:
        return
    codes = vocab.language_tokens()
    if _is_code(vocab, name) and like not in codes:
        raise DataError(
            f'{key}: {name}={like}: a new language code starts from the row of a related '
            f"language's code, and {like!r} is none ({few_codes(codes)}); or drop '={like}' "
            "for the mean of the codes' rows."
        )
    if like in codes and not _is_code(vocab, name):
        shape = getattr(vocab, 'code_shape', 'their shape')
        raise DataError(
            f'{key}: {name}={like}: {name!r} copies a language code but is not shaped as this '
            f"vocabulary's codes, {shape}, so it would be no language code: name it in that "
            'shape.'
        )


def like_rows(
    vocab: Any, added: list[tuple[str, str | None]]
) -> list[int | tuple[int, ...] | None]:
    """How each new token's rows start: our id of its LIKE (a copy of that row), the ids of the
    language codes for a new code without LIKE (the mean of their rows), or None (the mean of
    all rows) (module docstring)."""
    rows: list[int | tuple[int, ...] | None] = []
    for name, like in added:
        if like is not None:
            rows.append(vocab.token_id(like))
        elif _is_code(vocab, name):
            rows.append(tuple(vocab.token_id(code) for code in vocab.language_tokens()))
        else:
            rows.append(None)
    return rows
