"""A MarianMT (OPUS-MT) vocabulary behind the interface of the joint SentencePiece `Tokenizer`.

A MarianMT directory holds two SentencePiece models, ``source.spm`` for the source language and
``target.spm`` for the target, and ``vocab.json``, the model's one vocabulary of both: text is
cut into pieces by its side's model and each piece is looked up in vocab.json, never by the
SentencePiece id (a piece that vocab.json lacks is unknown). This is what transformers'
``MarianTokenizer`` does, and `MarianVocabulary.encode` gives its ids on every line, its
handling of a leading language code (``>>fra<< text``) and of special-token strings included
(one deliberate difference, below).

Ids: a Marian vocabulary puts ``</s>``, ``<unk>`` and ``<pad>`` (also the decoder's start)
wherever its build left them: OPUS-MT's first generation at 0, 1 and V-1, the Tatoeba-Challenge
generation (``opus-mt-tc-*``) anywhere (eos 43311 and pad 53016 of 53017, say). Ours
(transformer/tokens.py, `JOINT`) are the joint vocabulary's: pad 0, eos 1, unk 2 (pretrained.md).
One permutation of the ids, read from vocab.json, maps Marian's onto ours: our 0, 1, 2
are Marian's pad, eos and unk, and our 3.. are every other Marian id in increasing order. For
the first generation that is Marian's ids turned by one, ``ours = (marian + 1) % V``. The rows
of an embedding or of ``final_logits_bias`` move the same way (`MarianVocabulary.rows_to_ours`,
`rows_to_marian`), and an export moves them back, so Marian's own ids come back unchanged.

Tokens added to the vocabulary (marian_added.py: a corpus tag, ``<bt>``) are
the last pieces of vocab.json, registered in tokenizer_config.json's ``added_tokens_decoder``;
as MarianTokenizer does, their strings are cut out of the text wherever they stand and map to
their ids.

The difference from MarianTokenizer: it takes ``'</s>'`` or ``'<pad>'`` written in the text as
its eos or pad token; here they are unknown (id 2), as ``'<unk>'`` is in both, because an
end-of-sentence or a padding id inside a sentence would cut it short or mask it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from transformer.data import SIDES, DataError, Pretokenizer, Side
from transformer.interop.marian_added import ADDED_KEY, registered
from transformer.tokens import EOS_ID, JOINT, PAD_ID, UNK_ID

FILES = ('source.spm', 'target.spm', 'vocab.json')  # what a MarianMT vocabulary needs
TOKENIZER_CONFIG = 'tokenizer_config.json'  # optional: its source_lang and target_lang
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'  # optional, copied with the vocabulary
EOS, UNK, PAD = '</s>', '<unk>', '<pad>'  # Marian's special pieces, at any of its ids
# MarianTokenizer cuts these out of the text before SentencePiece sees it (its special tokens),
# and the tokens added to the vocabulary (`MarianVocabulary.added`).
_SPECIAL = (EOS, UNK, PAD)


def _cutter(added: Sequence[str]) -> re.Pattern:
    tokens = sorted({*_SPECIAL, *added}, key=len, reverse=True)  # the longest match first
    return re.compile('(' + '|'.join(re.escape(t) for t in tokens) + ')')


class MarianVocabulary:
    """A MarianMT directory's vocabulary, with this project's ids.

    Attributes:
      directory: the directory it was loaded from.
      vocab_size: V, the number of pieces in vocab.json (pad, eos and unk included).
      fingerprint: a hash of source.spm, target.spm, vocab.json and the added tokens, part
        of the token-cache keys.
      added: the tokens added to the vocabulary (module docstring), in id order.
      source_lang, target_lang: tokenizer_config.json's, or None.
      pretokenize: always 'none': MarianMT models read raw text.
      pretokenizer: a `Pretokenizer` that leaves text as it is.
      special: its special ids in our order: the joint vocabulary's (`tokens.JOINT`),
        which the permutation (module docstring) makes them, with the ids its model bans
        (the constructor's ``never_emit``) never emitted besides pad.
    """

    pretokenize = 'none'

    def __init__(
        self,
        directory: str | os.PathLike,
        key: str | None = None,
        data_config=None,
        never_emit: Sequence[int] = (),
    ):
        """``key``: the setting that named the directory, for the error messages.
        ``data_config``: the ``data`` section; its ``pretokenize`` must be 'none'.
        ``never_emit``: ids (ours) no search may output besides pad: a MarianMT's
        ``bad_words_ids`` live in its generation config, not in the vocabulary's files, so
        the conversion passes them here, a run's config.json records them
        (``data.never_emit``) and its vocabulary is loaded with that record."""
        self.directory = os.fspath(directory)
        self.special = dataclasses.replace(JOINT, never_emit=(*JOINT.never_emit, *never_emit))
        where = f'{key}={self.directory}' if key else self.directory
        paths = [os.path.join(self.directory, name) for name in FILES]
        for path in paths:
            if not os.path.isfile(path):
                raise DataError(
                    f'{path} does not exist: a MarianMT vocabulary ({where}) is the files '
                    f'{", ".join(FILES)}.'
                )
        contents = []
        for path in paths:
            with open(path, 'rb') as f:
                contents.append(f.read())
        config = _tokenizer_config(self.directory)
        self._pieces = _read_vocab(paths[2], contents[2])  # Marian's id -> piece
        known = set(self._pieces) - set(_SPECIAL)
        self.added = [t for t in registered(config) if t in known]
        contents.append('\n'.join(self.added).encode())
        self.fingerprint = hashlib.sha256(
            b''.join(len(c).to_bytes(8, 'little') + c for c in contents)
        ).hexdigest()[:16]
        self._cut = _cutter(self.added)
        self._spm = {
            side: _load_spm(path, proto)
            for side, path, proto in zip(SIDES, paths[:2], contents[:2], strict=True)
        }
        self._marian = _order(self._pieces)  # our id -> Marian's
        self._ours = np.argsort(self._marian)  # Marian's id -> ours
        self._ids = {piece: self.our_id(i) for i, piece in enumerate(self._pieces)}
        self._added_ids = {self._ids[t] for t in self.added}
        self.source_lang, self.target_lang = _languages(config, self.directory)
        _check_registered(config, self._pieces, self.directory)
        if data_config is not None and data_config.pretokenize != 'none':
            raise DataError(
                f'{where} is a MarianMT vocabulary, which reads raw text: set '
                f'data.pretokenize=none, not {data_config.pretokenize!r}.'
            )
        self.pretokenizer = Pretokenizer('none', self.source_lang, self.target_lang, False)

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        """Token ids of ``text`` (``side`` picks the SentencePiece model), without EOS:
        MarianTokenizer's ids in our order (module docstring)."""
        return self.encode_batch([text], side)[0]

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        """Token ids of many texts of one side (without EOS), segmented on all cores."""
        if side not in SIDES:
            raise ValueError(f'side must be one of {SIDES}, got {side!r}.')
        parts = [_split(text, self._cut) for text in texts]
        plain = [chunk for split in parts for kind, chunk in split if kind == 'text']
        pieces = iter(self._spm[side].encode(plain, out_type=str, num_threads=os.cpu_count() or 1))
        out = []
        for split in parts:
            ids = []
            for kind, chunk in split:
                if kind == 'text':
                    ids += [self._ids.get(p, UNK_ID) for p in next(pieces)]
                elif kind == 'code':
                    ids.append(self._ids.get(chunk, UNK_ID))
                elif chunk in _SPECIAL:  # a special token's string: unknown (docstring)
                    ids.append(UNK_ID)
                else:  # an added token
                    ids.append(self._ids[chunk])
            out.append(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS, padding, unknown and added tokens skipped: what
        ``MarianTokenizer.decode(..., skip_special_tokens=True)`` gives, with target.spm."""
        pieces = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == EOS_ID:
                break
            if i not in (PAD_ID, UNK_ID) and i not in self._added_ids:
                pieces.append(self.id_to_piece(i))
        text = self._spm['target'].decode_pieces(pieces)
        return text.replace('▁', ' ').strip()

    def id_to_piece(self, i: int) -> str:
        """The vocab.json piece of our id ``i``."""
        return self._pieces[self.marian_id(i)]

    def token_id(self, piece: str) -> int | None:
        """Our id of the vocab.json piece ``piece`` (a language token), or None."""
        return self._ids.get(piece)

    def language_tokens(self) -> list[str]:
        """The target-language tokens (``>>xx<<``) of vocab.json, in id order."""
        return [p for p in self._pieces if p.startswith('>>') and p.endswith('<<')]

    def marian_id(self, i: int) -> int:
        """Marian's id of our id ``i`` (module docstring)."""
        return int(self._marian[i])

    def our_id(self, i: int) -> int:
        """Our id of Marian's id ``i``."""
        return int(self._ours[i])

    def marian_special_ids(self) -> dict[str, int]:
        """Marian's ids of its pad (the decoder's start), eos and unk, as vocab.json has them."""
        return {
            'pad': self.marian_id(PAD_ID),
            'eos': self.marian_id(EOS_ID),
            'unk': self.marian_id(UNK_ID),
        }

    @staticmethod
    def holds(directory: str | os.PathLike) -> bool:
        """Whether ``directory`` holds a MarianMT vocabulary (its vocab.json)."""
        return os.path.isfile(os.path.join(directory, FILES[2]))

    def copy_to(self, directory: str | os.PathLike) -> None:
        """Copies its files (and tokenizer_config.json and special_tokens_map.json, where
        there are) into ``directory``, as they are; files already there are kept."""
        for name in (*FILES, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
            source, target = (os.path.join(d, name) for d in (self.directory, directory))
            if os.path.isfile(source) and not os.path.exists(target):
                shutil.copyfile(source, target)

    def rows_to_ours(self, x: Any) -> np.ndarray:
        """``x`` (V rows in Marian's order: an embedding, final_logits_bias) in our order:
        row ``our_id(m)`` of the result is row ``m`` of ``x``."""
        return np.asarray(x)[self._marian]

    def rows_to_marian(self, x: Any) -> np.ndarray:
        """The inverse of `rows_to_ours`: V rows in our order put in Marian's."""
        return np.asarray(x)[self._ours]


def _split(text: str, cut: re.Pattern) -> list[tuple[str, str]]:
    """``text`` as MarianTokenizer cuts it: its special and added tokens' strings ('special',
    ``cut`` finds them) out, and a language code ('code', ``>>xx<<``) off the start of each
    piece between them ('text')."""
    parts = []
    for n, chunk in enumerate(cut.split(text)):
        if n % 2:
            parts.append(('special', chunk))
            continue
        if not chunk:  # MarianTokenizer skips empty chunks, and no code is in one
            continue
        if chunk.startswith('>>') and (end := chunk.find('<<')) != -1:
            parts.append(('code', chunk[: end + 2]))
            chunk = chunk[end + 2 :]
        parts.append(('text', chunk))
    return parts


def _load_spm(path: str, proto: bytes) -> spm.SentencePieceProcessor:
    if not proto:  # it would load as a model without pieces
        raise DataError(f"{path} is empty: restore the MarianMT directory's file.")
    try:
        return spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as e:
        raise DataError(f'{path} is not a SentencePiece model that loads ({e}).') from None


def _order(pieces: list[str]) -> np.ndarray:
    """Marian's id of each of our ids: our `PAD_ID`, `EOS_ID` and `UNK_ID` are its pad, eos and
    unk, and our other ids, in increasing order, its other ids in increasing order."""
    special = {PAD_ID: pieces.index(PAD), EOS_ID: pieces.index(EOS), UNK_ID: pieces.index(UNK)}
    order = np.empty(len(pieces), np.int64)
    mask = np.ones(len(pieces), bool)
    mask[list(special)] = False
    order[list(special)] = list(special.values())
    order[mask] = np.setdiff1d(np.arange(len(pieces)), list(special.values()))
    return order


def _read_vocab(path: str, content: bytes) -> list[str]:
    """vocab.json's pieces in Marian's id order, with its three special pieces."""

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
    if not isinstance(vocab, dict) or not all(
        type(i) is int and isinstance(p, str) for p, i in vocab.items()
    ):
        raise DataError(f'{path} must be a JSON object of piece -> integer id.')
    pieces: dict[int, str] = {}
    for piece, i in vocab.items():
        if i in pieces:
            raise DataError(f'{path} gives the id {i} to both {pieces[i]!r} and {piece!r}.')
        pieces[i] = piece
    size = len(vocab)
    for piece, what in ((EOS, 'end of sentence'), (UNK, 'unknown'), (PAD, 'padding')):
        if piece not in vocab:
            raise DataError(
                f'{path} has no {piece!r} (the {what} token a MarianMT vocabulary holds).'
            )
    if set(pieces) != set(range(size)):
        outside = sorted(i for i in pieces if not 0 <= i < size)[:3]
        raise DataError(f'{path} has ids outside 0..{size - 1} (its size - 1): {outside}.')
    return [pieces[i] for i in range(size)]


def _tokenizer_config(directory: str) -> dict[str, Any]:
    """tokenizer_config.json ({} without one)."""
    path = os.path.join(directory, TOKENIZER_CONFIG)
    return _read_object(path) if os.path.isfile(path) else {}


def _languages(config: dict[str, Any], directory: str) -> tuple[str | None, str | None]:
    """tokenizer_config.json's (``config``) source_lang and target_lang, once its special
    tokens and special_tokens_map.json's are Marian's (`_check_special_names`)."""
    path = os.path.join(directory, TOKENIZER_CONFIG)
    if config.get('separate_vocabs'):
        raise DataError(
            f'{path} has separate_vocabs=true (a target_vocab.json): only one joint '
            'vocabulary is supported.'
        )
    _check_special_names(config, path)
    special_map = os.path.join(directory, SPECIAL_TOKENS_MAP)
    if os.path.isfile(special_map):
        _check_special_names(_read_object(special_map), special_map)
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


def _check_registered(config: dict[str, Any], pieces: list[str], directory: str) -> None:
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


def _read_object(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding='utf-8') as f:
            value = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path} is not JSON ({e}).') from None
    if not isinstance(value, dict):
        raise DataError(f'{path} must be a JSON object.')
    return value
