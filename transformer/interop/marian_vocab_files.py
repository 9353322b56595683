"""A MarianMT vocabulary's files read and checked (marian_vocab.py's `MarianVocabulary` holds
them): vocab.json (and target_vocab.json) as pieces in Marian's id order, the permutation of its
ids onto ours, its SentencePiece models, and tokenizer_config.json and special_tokens_map.json,
whose special tokens and registered tokens must agree with vocab.json.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import sentencepiece as spm

from transformer.data import DataError
from transformer.interop.json_files import in_id_order, piece_ids, read_object
from transformer.interop.marian_added import ADDED_KEY
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID

TOKENIZER_CONFIG = 'tokenizer_config.json'  # optional: its source_lang and target_lang
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'  # optional, copied with the vocabulary
EOS, UNK, PAD = '</s>', '<unk>', '<pad>'  # Marian's special pieces, at any of its ids


def load_spm(path: str, proto: bytes) -> spm.SentencePieceProcessor:
    if not proto:  # it would load as a model without pieces
        raise DataError(f"{path} is empty: restore the MarianMT directory's file.")
    try:
        return spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as e:
        raise DataError(f'{path} is not a SentencePiece model that loads ({e}).') from None


def id_order(pieces: list[str]) -> np.ndarray:
    """Marian's id of each of our ids: our `PAD_ID`, `EOS_ID` and `UNK_ID` are its pad, eos and
    unk, and our other ids, in increasing order, its other ids in increasing order."""
    special = {PAD_ID: pieces.index(PAD), EOS_ID: pieces.index(EOS), UNK_ID: pieces.index(UNK)}
    order = np.empty(len(pieces), np.int64)
    mask = np.ones(len(pieces), bool)
    mask[list(special)] = False
    order[list(special)] = list(special.values())
    order[mask] = np.setdiff1d(np.arange(len(pieces)), list(special.values()))
    return order


def read_vocab(path: str, content: bytes) -> list[str]:
    """vocab.json's pieces in Marian's id order, with its three special pieces."""
    pieces = piece_ids(path, content)
    held = set(pieces.values())
    for piece, what in ((EOS, 'end of sentence'), (UNK, 'unknown'), (PAD, 'padding')):
        if piece not in held:
            raise DataError(
                f'{path} has no {piece!r} (the {what} token a MarianMT vocabulary holds).'
            )
    return in_id_order(path, pieces)


def tokenizer_config(directory: str) -> dict[str, Any]:
    """tokenizer_config.json ({} without one)."""
    path = os.path.join(directory, TOKENIZER_CONFIG)
    return read_object(path) if os.path.isfile(path) else {}


def languages(config: dict[str, Any], directory: str) -> tuple[str | None, str | None]:
    """tokenizer_config.json's (``config``) source_lang and target_lang, once its special
    tokens and special_tokens_map.json's are Marian's (`_check_special_names`)."""
    path = os.path.join(directory, TOKENIZER_CONFIG)
    _check_special_names(config, path)
    special_map = os.path.join(directory, SPECIAL_TOKENS_MAP)
    if os.path.isfile(special_map):
        _check_special_names(read_object(special_map), special_map)
    return config.get('source_lang'), config.get('target_lang')


def _check_special_names(config: dict[str, Any], path: str) -> None:
    """A `DataError` unless ``config``'s (read from ``path``) eos, unk and pad tokens, where
    it names them, are Marian's pieces: as a string, or as the dict of a saved AddedToken
    (transformers 4.2x-4.3x write ``{"__type": "AddedToken", "content": "</s>", ...}``)."""
    for name, want in (('eos_token', EOS), ('unk_token', UNK), ('pad_token', PAD)):
        value = config.get(name, want)
        if isinstance(value, dict):
            value = value.get('content')
        if value != want:
            raise DataError(f"{path} has {name}={value!r}; only Marian's {want!r} is supported.")


def check_registered(config: dict[str, Any], pieces: list[str], directory: str) -> None:
    """A `DataError` unless every token tokenizer_config.json's ``added_tokens_decoder``
    (``config``'s; transformers 4.3x-5 register the special pieces there too) holds at an id
    is vocab.json's piece of that id (``pieces``: Marian's id -> piece): Hugging Face's
    tokenizer maps the token to the registered id, ours to vocab.json's."""
    entries = config.get(ADDED_KEY) or {}
    if not isinstance(entries, dict):
        return
    path = os.path.join(directory, TOKENIZER_CONFIG)
    for key, entry in entries.items():
        content = entry.get('content') if isinstance(entry, dict) else entry
        at = int(key) if str(key).isdigit() else -1
        if not 0 <= at < len(pieces) or pieces[at] != content:
            held = pieces[at] if 0 <= at < len(pieces) else 'nothing'
            raise DataError(
                f'{path}: {ADDED_KEY} puts {content!r} at id {key}, where vocab.json holds '
                f'{held!r}: make the two files agree.'
            )
