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

Separate vocabularies (tokenizer_config.json's ``separate_vocabs``: vocab.json holds the source's
pieces, target_vocab.json the target's, each with its own ``</s>``, ``<unk>`` and ``<pad>``):
one such permutation per side, each with the special ids first, so pad, eos, unk and the
decoder's start are our 0, 1, 2 and 0 on both sides. The model has one vocabulary size, V, the
larger side's: the smaller side's ids stop short of it, and its rows past its pieces are
padding (`rows_to_ours`'s ``fill``). A source id there is never read (no piece encodes to
it); a target id there is never emitted (``special.never_emit`` holds it, which every search
honours) and its output bias is so low that its probability is 0 (marian_params.py).

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
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from transformer.data import SIDES, DataError, Pretokenizer, Side
from transformer.interop.marian_added import registered
from transformer.interop.marian_vocab_files import (
    EOS,
    PAD,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    UNK,
    check_registered,
    id_order,
    languages,
    load_spm,
    read_vocab,
    tokenizer_config,
)
from transformer.tokens import EOS_ID, JOINT, PAD_ID, UNK_ID

FILES = ('source.spm', 'target.spm', 'vocab.json')  # what a MarianMT vocabulary needs
TARGET_VOCAB = 'target_vocab.json'  # the target's pieces, with separate_vocabs
# MarianTokenizer cuts these out of the text before SentencePiece sees it (its special tokens),
# and the tokens added to the vocabulary (`MarianVocabulary.added`).
_SPECIAL = (EOS, UNK, PAD)


def _cutter(added: Sequence[str]) -> re.Pattern:
    tokens = sorted({*_SPECIAL, *added}, key=len, reverse=True)  # the longest match first
    return re.compile('(' + '|'.join(re.escape(t) for t in tokens) + ')')


def _read(path: str) -> bytes:
    with open(path, 'rb') as f:
        return f.read()


def _read_files(directory: str, names, where: str) -> tuple[list[str], list[bytes]]:
    """The paths of a MarianMT vocabulary's files ``names`` in ``directory`` and their bytes; a
    missing one is a one-line `DataError` naming them all (``where``: how it was named)."""
    paths = [os.path.join(directory, name) for name in names]
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(
                f'{path} does not exist: a MarianMT vocabulary ({where}) is the files '
                f'{", ".join(names)}.'
            )
    return paths, [_read(path) for path in paths]


class MarianVocabulary:
    """A MarianMT directory's vocabulary, with this project's ids.

    Attributes:
      directory: the directory it was loaded from.
      vocab_size: V, the number of ids: vocab.json's pieces (pad, eos and unk included); with
        separate vocabularies the larger side's (module docstring).
      sizes: {side: the number of that side's pieces} (equal without separate vocabularies).
      separate: whether the sides have vocabularies of their own (separate_vocabs).
      fingerprint: a hash of source.spm, target.spm, vocab.json (target_vocab.json) and the
        added tokens, part of the token-cache keys.
      added: the tokens added to the vocabulary (module docstring), in id order.
      source_lang, target_lang: tokenizer_config.json's, or None.
      pretokenize: always 'none': MarianMT models read raw text.
      pretokenizer: a `Pretokenizer` that leaves text as it is.
      special: its special ids in our order: the joint vocabulary's (`tokens.JOINT`), which
        the permutation (module docstring) makes them, with the ids its model bans (the
        constructor's ``never_emit``) and the target ids past the target's pieces (separate
        vocabularies, target the smaller) never emitted besides pad.
      no_added_tokens: why tokens cannot be added to it, or None (data/added_tokens.py).
      no_label_smoothing: why a run on it cannot train with label smoothing, or None: the
        smoothed target gives every id some probability, the padded target ids (which the
        model gives none) included.
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
        where = f'{key}={self.directory}' if key else self.directory
        config = tokenizer_config(self.directory)
        self.separate = bool(config.get('separate_vocabs'))
        names = (*FILES, TARGET_VOCAB) if self.separate else FILES
        paths, contents = _read_files(self.directory, names, where)
        source = read_vocab(paths[2], contents[2])  # Marian's id -> piece
        target = read_vocab(paths[3], contents[3]) if self.separate else source
        self._pieces = {'source': source, 'target': target}
        self.sizes = {side: len(p) for side, p in self._pieces.items()}
        known = set(source) - set(_SPECIAL)
        self.added = [t for t in registered(config) if t in known]
        self._refusals()
        if self.added and self.no_added_tokens:
            raise DataError(f'{paths[2]}: {self.no_added_tokens}')
        contents.append('\n'.join(self.added).encode())
        self.fingerprint = hashlib.sha256(
            b''.join(len(c).to_bytes(8, 'little') + c for c in contents)
        ).hexdigest()[:16]
        self._cut = _cutter(self.added)
        self._spm = {
            side: load_spm(path, proto)
            for side, path, proto in zip(SIDES, paths[:2], contents[:2], strict=True)
        }
        self._marian = {side: id_order(p) for side, p in self._pieces.items()}  # ours -> Marian's
        self._ours = {side: np.argsort(m) for side, m in self._marian.items()}  # Marian's -> ours
        self._ids = {
            side: {piece: self.our_id(i, side) for i, piece in enumerate(p)}
            for side, p in self._pieces.items()
        }
        self._added_ids = {self._ids['source'][t] for t in self.added}
        # Target ids past the target's pieces (rows padded up to V) are never output.
        padded = range(self.sizes['target'], self.vocab_size)
        self.special = dataclasses.replace(
            JOINT, never_emit=(*JOINT.never_emit, *padded, *never_emit)
        )
        self.source_lang, self.target_lang = languages(config, self.directory)
        check_registered(config, source, self.directory)
        if data_config is not None and data_config.pretokenize != 'none':
            raise DataError(
                f'{where} is a MarianMT vocabulary, which reads raw text: set '
                f'data.pretokenize=none, not {data_config.pretokenize!r}.'
            )
        self.pretokenizer = Pretokenizer('none', self.source_lang, self.target_lang, False)

    def _refusals(self) -> None:
        """Sets `no_added_tokens` and `no_label_smoothing` (the class docstring)."""
        self.no_added_tokens = self.no_label_smoothing = None
        if self.separate:
            self.no_added_tokens = (
                f'{self.directory} has separate source and target vocabularies '
                '(separate_vocabs); tokens are added to a joint MarianMT vocabulary only.'
            )
        if self.sizes['target'] < self.vocab_size:
            self.no_label_smoothing = (
                f'{self.directory} has a target vocabulary of {self.sizes["target"]} pieces, '
                f"fewer than the source's {self.vocab_size}: label smoothing would spread "
                'probability over the target ids past its pieces, which the model gives none; '
                'set --config.train.label_smoothing=0.'
            )

    @property
    def vocab_size(self) -> int:
        return max(self.sizes.values())

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        """Token ids of ``text`` (``side`` picks the SentencePiece model and, with separate
        vocabularies, the vocabulary), without EOS: MarianTokenizer's ids in our order
        (module docstring)."""
        return self.encode_batch([text], side)[0]

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        """Token ids of many texts of one side (without EOS), segmented on all cores."""
        if side not in SIDES:
            raise ValueError(f'side must be one of {SIDES}, got {side!r}.')
        parts = [_split(text, self._cut) for text in texts]
        plain = [chunk for split in parts for kind, chunk in split if kind == 'text']
        pieces = iter(self._spm[side].encode(plain, out_type=str, num_threads=os.cpu_count() or 1))
        known = self._ids[side]
        out = []
        for split in parts:
            ids = []
            for kind, chunk in split:
                if kind == 'text':
                    ids += [known.get(p, UNK_ID) for p in next(pieces)]
                elif kind == 'code':
                    ids.append(known.get(chunk, UNK_ID))
                elif chunk in _SPECIAL:  # a special token's string: unknown (docstring)
                    ids.append(UNK_ID)
                else:  # an added token
                    ids.append(known[chunk])
            out.append(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of target ``ids`` up to the first EOS, padding, unknown and added tokens
        skipped: what ``MarianTokenizer.decode(..., skip_special_tokens=True)`` gives, with
        target.spm."""
        pieces = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == EOS_ID:
                break
            if i not in self.special.never_emit and i != UNK_ID and i not in self._added_ids:
                pieces.append(self.id_to_piece(i))
        text = self._spm['target'].decode_pieces(pieces)
        return text.replace('\u2581', ' ').strip()

    def id_to_piece(self, i: int, side: Side = 'target') -> str:
        """The piece of our id ``i`` of ``side`` (vocab.json's, or target_vocab.json's)."""
        return self._pieces[side][self.marian_id(i, side)]

    def token_id(self, piece: str) -> int | None:
        """Our id of the source piece ``piece`` (a language token, an added token), or None."""
        return self._ids['source'].get(piece)

    def language_tokens(self) -> list[str]:
        """The target-language tokens (``>>xx<<``) of vocab.json, in id order."""
        return [p for p in self._pieces['source'] if p.startswith('>>') and p.endswith('<<')]

    def marian_id(self, i: int, side: Side = 'target') -> int:
        """Marian's id of our id ``i`` of ``side`` (module docstring)."""
        return int(self._marian[side][i])

    def our_id(self, i: int, side: Side = 'target') -> int:
        """Our id of Marian's id ``i`` of ``side``."""
        return int(self._ours[side][i])

    def marian_special_ids(self) -> dict[str, int]:
        """Marian's ids of the target's pad (the decoder's start), eos and unk, as its
        vocabulary (vocab.json, or target_vocab.json) has them: config.json's."""
        return {
            'pad': self.marian_id(PAD_ID),
            'eos': self.marian_id(EOS_ID),
            'unk': self.marian_id(UNK_ID),
        }

    @staticmethod
    def holds(directory: str | os.PathLike) -> bool:
        """Whether ``directory`` holds a MarianMT vocabulary: its source.spm, target.spm and
        vocab.json (an M2M100 vocabulary has a vocab.json too, never the two models)."""
        return all(os.path.isfile(os.path.join(directory, name)) for name in FILES)

    def copy_to(self, directory: str | os.PathLike) -> None:
        """Copies its files (and target_vocab.json, tokenizer_config.json and
        special_tokens_map.json, where there are) into ``directory``, as they are; files
        already there are kept."""
        for name in (*FILES, TARGET_VOCAB, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
            source, target = (os.path.join(d, name) for d in (self.directory, directory))
            if os.path.isfile(source) and not os.path.exists(target):
                shutil.copyfile(source, target)

    def rows_to_ours(self, x: Any, side: Side = 'target', fill: float = 0.0) -> np.ndarray:
        """``x`` (one row per piece of ``side`` in Marian's order: an embedding,
        final_logits_bias) as V rows in our order: row ``our_id(m)`` of the result is row ``m``
        of ``x``; the rows past the side's pieces (separate vocabularies) are ``fill``."""
        x = np.asarray(x)
        out = np.full((self.vocab_size, *x.shape[1:]), fill, x.dtype)
        out[: len(x)] = x[self._marian[side]]
        return out

    def rows_to_marian(self, x: Any, side: Side = 'target') -> np.ndarray:
        """The inverse of `rows_to_ours`: V rows in our order put in Marian's, the rows past
        the side's pieces left out."""
        return np.asarray(x)[self._ours[side]]


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
