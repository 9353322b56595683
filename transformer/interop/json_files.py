"""The JSON files of pretrained directories, read with one-line errors: a JSON object
(config files, tokenizer_config.json) and a vocab.json (piece -> id), for every family."""

from __future__ import annotations

import json
from typing import Any

from transformer.data import DataError


def read_object(path: str) -> dict[str, Any]:
    """The JSON object in ``path``; a one-line `DataError` for anything else."""
    try:
        with open(path, encoding='utf-8') as f:
            value = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path} is not JSON ({e}).') from None
    if not isinstance(value, dict):
        raise DataError(f'{path} must be a JSON object.')
    return value


def piece_ids(path: str, content: bytes) -> dict[int, str]:
    """vocab.json's pieces by id (``content``, read from ``path``): a JSON object of piece ->
    integer id, each piece and each id once; a one-line `DataError` otherwise."""

    def unique(pairs):
        seen = {}
        for piece, i in pairs:
            if piece in seen:
                raise DataError(f'{path} has the piece {piece!r} twice.')
            seen[piece] = i
        return seen

    try:
        vocab = json.loads(content.decode('utf-8'), object_pairs_hook=unique)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path} is not JSON ({e}).') from None
    if not isinstance(vocab, dict) or not all(type(i) is int for i in vocab.values()):
        raise DataError(f'{path} must be a JSON object of piece -> integer id.')
    pieces: dict[int, str] = {}
    for piece, i in vocab.items():
        if i in pieces:
            raise DataError(f'{path} gives the id {i} to both {pieces[i]!r} and {piece!r}.')
        pieces[i] = piece
    return pieces


def in_id_order(path: str, pieces: dict[int, str]) -> list[str]:
    """``pieces`` (`piece_ids` of ``path``) as a list, once its ids are 0 .. n - 1."""
    size = len(pieces)
    if set(pieces) != set(range(size)):
        outside = sorted(i for i in pieces if not 0 <= i < size)[:3]
        raise DataError(f'{path} has ids outside 0..{size - 1} (its size - 1): {outside}.')
    return [pieces[i] for i in range(size)]
