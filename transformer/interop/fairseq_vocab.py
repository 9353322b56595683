"""An NLLB-200, M2M100 or mBART-50 vocabulary behind the interface of the joint SentencePiece
`Tokenizer` (data/vocabulary.py's `Vocabulary`), with transformers 5's ids, read without
transformers (fairseq_vocab_files.py reads the files, fairseq_backend.py builds NLLB-200's and
mBART-50's tokenizer as transformers 5 does).

Ids: fairseq's, kept as they are: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3; then the
pieces (NLLB-200 and mBART-50: each at its SentencePiece id + 1; M2M100: vocab.json's, fairseq's
dictionary order); then the language codes (NLLB-200's ``eng_Latn`` ..., M2M100's ``__en__``
..., mBART-50's ``en_XX`` ...) and ``<mask>`` in the order transformers 5 registers them, and
the tokens added to the vocabulary. The decoder starts from ``</s>``
(``special.decoder_start`` = eos = 2) and pads with 1, so `special` is not `tokens.JOINT`.

The model's embedding may have more rows than the tokenizer has ids (NLLB-200's 256206 rows for
256204 ids; fairseq pads a dictionary to a multiple of 8 with rows named ``madeupword0000``
...): the constructor's ``rows`` (config.json's ``vocab_size``) makes `vocab_size` the model's
rows, V, and the ids past the tokenizer's keep their rows; they have no text (decoding skips
them) and are named ``madeupwordNNNN`` (fairseq's name for them). The files this vocabulary
writes (`write`, fairseq_vocab_write.py) register those names at those ids, so a run's copy of
the vocabulary, and Hugging Face's tokenizer reading it, have V ids.

The functions a family entry takes (family.py's `Family`) are `load_vocabulary`,
`holds_vocabulary`, `write_vocabulary` and `tokenizer_files`.

A sentence pair (`prefixes`): source ``[src_code] X </s>``, target labels ``[tgt_code] X </s>``
(transformers 5's non-legacy layout); the decoder's input is ``</s> [tgt_code] X``, so decoding
starts from ``</s>`` with the target code forced as the first output, as ``generate`` does with
``forced_bos_token_id``. `encode` gives X alone (no code, no EOS), as every vocabulary does.

Two differences from transformers 5's tokenizers:

- ``'</s>'`` or ``'<pad>'`` written in the text is ``<unk>`` here (theirs give the eos or pad
  id), because an end-of-sentence or a padding id inside a sentence would cut it short or mask
  it; the codes, ``<s>``, ``<mask>`` and the added tokens written in the text are theirs
  (M2M100's codes are text there unless tokenizer_config.json lists them as special tokens, as
  the hub's files do: ``M2M100Tokenizer`` cuts ``__fr__`` out of the text only then);
- decoding skips M2M100's codes, as it skips NLLB-200's and mBART-50's; transformers 5's
  ``M2M100Tokenizer`` without that list does not count them as special tokens, so its
  ``decode(..., skip_special_tokens=True)`` of an output gives ``'__de__ Ein Hund'``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Sequence

import numpy as np

from transformer.data import SIDES, DataError, Pretokenizer, Side, few_codes
from transformer.interop.fairseq_backend import FAIRSEQ_SPECIAL, MASK
from transformer.interop.fairseq_codes import m2m100_token
from transformer.interop.fairseq_config import FAIRSEQ_IDS
from transformer.interop.fairseq_vocab_files import (
    CLASSES,
    CODE_FORMS,
    CODE_SHAPES,
    SPM_FILE,
    TITLES,
    TOKENIZER_JSON,
    read_table,
    tokenizer_config,
)
from transformer.interop.fairseq_vocab_write import write

# fairseq's dictionary: <s> 0, and the model's ids as fairseq_config.py declares them (the
# tokenizer's <pad>, </s>, <unk>: fairseq_backend.FAIRSEQ_SPECIAL, a test checks).
FAIRSEQ = FAIRSEQ_IDS
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, FAIRSEQ.pad, FAIRSEQ.eos, FAIRSEQ.unk
FILLER = 'madeupword{:04d}'  # fairseq's name for the rows that pad its dictionary


@dataclasses.dataclass(frozen=True)
class Prefixes:
    """The ids before a sentence pair's texts (the EOS after each is the pipeline's).

    Attributes:
      source: before the source's ids: ``(src_code,)``.
      target: before the target's ids in the labels, which decoding forces as its first
        outputs (after the decoder's start, ``</s>``): ``(tgt_code,)``.
    """

    source: tuple[int, ...]
    target: tuple[int, ...]


class FairseqVocabulary:
    """An NLLB-200, M2M100 or mBART-50 directory's vocabulary (module docstring).

    Attributes:
      directory: the directory it was loaded from.
      kind: 'nllb', 'm2m100' or 'mbart50'; title: 'NLLB-200', 'M2M100' or 'mBART-50'.
      size: the tokenizer's ids (pieces, codes, ``<mask>``, added tokens).
      vocab_size: V, the model's rows: ``rows``, or `size` without it.
      added: the registered tokens other than fairseq's four, ``<mask>`` and the codes (tokens
        added to the vocabulary, ``madeupwordNNNN`` rows), in id order.
      fingerprint: a hash of the files that give the ids, their registered tokens and V.
      pretokenize: always 'none': these models read raw text.
      special: pad 1, eos 2 (also the decoder's start), unk 3; pad and the constructor's
        ``never_emit`` never emitted.
      no_added_tokens, no_label_smoothing: None: tokens can be added, label smoothing is
        allowed.
    """

    pretokenize = 'none'
    no_added_tokens = None
    no_label_smoothing = None

    def __init__(
        self,
        directory: str | os.PathLike,
        key: str | None = None,
        data_config=None,
        never_emit: Sequence[int] = (),
        rows: int | None = None,
        kind: str | None = None,
    ):
        """``key``: the setting that named the directory, for the messages. ``data_config``:
        the ``data`` section; its ``pretokenize`` must be 'none'. ``never_emit``: ids no search
        may output besides pad (a model's ``bad_words_ids``; a run's ``data.never_emit``).
        ``rows``: the model's embedding rows (config.json's ``vocab_size``), at least the
        tokenizer's ids; None: as many. ``kind``: the family, where tokenizer_config.json does
        not name its tokenizer_class."""
        self.directory = os.fspath(directory)
        where = f'{key}={self.directory}' if key else self.directory
        table = read_table(self.directory, kind, where)
        self._table = table
        self.kind, self.title = table.kind, TITLES[table.kind]
        self.size = len(table.pieces)
        self.rows = self.size if rows is None else int(rows)
        if self.rows < self.size:
            raise DataError(
                f"{where}: the model has {self.rows} embedding rows (config.json's vocab_size), "
                f'fewer than the {self.size} ids of its {self.title} tokenizer: the vocabulary '
                "files are not the model's."
            )
        self._ids = {piece: i for i, piece in enumerate(table.pieces)}
        codes = set(table.codes)
        self.added = [
            table.pieces[i]
            for i in sorted(table.special)
            if table.pieces[i] not in (*FAIRSEQ_SPECIAL, MASK) and table.pieces[i] not in codes
        ]
        digest = hashlib.sha256(str(self.rows).encode())
        for content in table.contents:
            digest.update(len(content).to_bytes(8, 'little') + content)
        self.fingerprint = digest.hexdigest()[:16]
        self.special = dataclasses.replace(FAIRSEQ, never_emit=(*FAIRSEQ.never_emit, *never_emit))
        if self.special.largest() >= self.rows:
            raise DataError(
                f'{where}: never_emit={tuple(never_emit)} names ids past its {self.rows}.'
            )
        if data_config is not None and data_config.pretokenize != 'none':
            raise DataError(
                f'{where} is an {self.title} vocabulary, which reads raw text: set '
                f'data.pretokenize=none, not {data_config.pretokenize!r}.'
            )
        self.pretokenizer = Pretokenizer('none', None, None, False)

    @property
    def vocab_size(self) -> int:
        return self.rows

    @property
    def registered(self) -> list[int]:
        """The ids of the tokens its tokenizer cuts out of the text (fairseq's four, the
        codes but M2M100's, ``<mask>``, the added tokens), in order: what its files register."""
        return sorted(self._table.registered)

    @property
    def config(self) -> dict:
        """tokenizer_config.json as read ({} without one)."""
        return self._table.config

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        """Ids of ``text`` (one vocabulary for both sides), without code or EOS: transformers
        5's, but for ``'</s>'`` and ``'<pad>'`` in the text (module docstring)."""
        return self.encode_batch([text], side)[0]

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        """Ids of many texts of one side, without code or EOS."""
        if side not in SIDES:
            raise ValueError(f'side must be one of {SIDES}, got {side!r}.')
        cut = (PAD_ID, EOS_ID)
        return [[UNK_ID if i in cut else i for i in ids] for ids in self._table.encode(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS, its special tokens (codes, ``<unk>``, ...) and
        the rows past the tokenizer's skipped: what transformers 5's
        ``decode(..., skip_special_tokens=True)`` gives."""
        kept = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == EOS_ID:
                break
            if i < self.size and i not in self.special.never_emit:
                kept.append(i)
        return self._table.decode(kept)

    def id_to_piece(self, i: int, side: Side = 'target') -> str:
        """The token of id ``i`` (a row past the tokenizer's: ``madeupwordNNNN``)."""
        if not 0 <= i < self.rows:
            raise IndexError(f'id {i} is not below the vocabulary size {self.rows}.')
        return self._table.pieces[i] if i < self.size else FILLER.format(i - self.size)

    def token_id(self, piece: str) -> int | None:
        """The id of ``piece`` (a piece, a special token, a language code), or None."""
        return self._ids.get(piece)

    def language_tokens(self) -> list[str]:
        """Its language codes, in id order."""
        return list(self._table.codes)

    def shaped_as_code(self, name: str) -> bool:
        """Whether a token added under ``name`` is a language code: it has the shape of the
        family's codes (`code_shape`), which is how its files and ours tell the codes from the
        other registered tokens (data/added_tokens.py)."""
        return CODE_FORMS[self.kind].fullmatch(name) is not None

    @property
    def code_shape(self) -> str:
        """The shape of its codes, as a message names it: ``'xxx_Xxxx (eng_Latn)'``."""
        return CODE_SHAPES[self.kind]

    def language_id(self, code: str, key: str = 'language') -> int:
        """The id of the language ``code`` (M2M100: 'en' or its token '__en__'); a one-line
        `DataError` naming ``key``, a few codes and their count for a code it lacks."""
        codes = self._table.codes
        for token in (code, m2m100_token(code)) if self.kind == 'm2m100' else (code,):
            if token in codes:
                return self._ids[token]
        raise DataError(
            f'{key}={code!r} is not a language code of this {self.title} vocabulary '
            f'({few_codes(codes)}).'
        )

    def prefixes(self, source_lang: str, target_lang: str) -> Prefixes:
        """The ids before a pair's source and target (module docstring), the codes checked
        (`language_id`)."""
        source = self.language_id(source_lang, 'source language')
        target = self.language_id(target_lang, 'target language')
        return Prefixes(source=(source,), target=(target,))

    def pair(self, source: str, target: str, source_lang: str, target_lang: str):
        """(source ids, target labels) of one pair: ``[src_code] X </s>`` and
        ``[tgt_code] Y </s>``, as transformers 5's tokenizer gives them with ``src_lang`` and
        ``tgt_lang`` (``text_target=``)."""
        prefixes = self.prefixes(source_lang, target_lang)
        source_ids = [*prefixes.source, *self.encode(source, 'source'), EOS_ID]
        return source_ids, [*prefixes.target, *self.encode(target, 'target'), EOS_ID]

    @staticmethod
    def holds(directory: str | os.PathLike) -> bool:
        """Whether ``directory`` holds such a vocabulary: a tokenizer_config.json naming one
        of their tokenizer classes, beside its SentencePiece model or tokenizer.json."""
        return held_kind(directory) is not None

    def copy_to(self, directory: str | os.PathLike) -> None:
        """Writes its files into ``directory`` (a run's ``vocab/``) with V ids (the rows past
        the tokenizer's registered, fairseq_vocab_write.py); files already there are kept."""
        write(self, [], os.fspath(directory), keep=True)


def held_kind(directory: str | os.PathLike) -> str | None:
    """The kind ('nllb', 'm2m100', 'mbart50') of the vocabulary ``directory`` holds (a
    tokenizer_config.json naming its tokenizer class, beside its SentencePiece model or
    tokenizer.json), or None; never raises."""
    try:
        named = tokenizer_config(os.fspath(directory)).get('tokenizer_class')
    except (DataError, OSError):
        return None
    files = (os.path.join(directory, name) for name in (SPM_FILE, TOKENIZER_JSON))
    if named not in CLASSES or not any(os.path.isfile(f) for f in files):
        return None
    return CLASSES[named]


def load_vocabulary(
    directory: str, key: str | None = None, data_config=None, never_emit=()
) -> FairseqVocabulary:
    """The vocabulary in ``directory`` (`Family.load_vocabulary`): a run's copy holds V ids."""
    return FairseqVocabulary(directory, key, data_config, never_emit)


def holds_vocabulary(directory: str) -> bool:
    """Whether ``directory`` holds such a vocabulary (`Family.holds_vocabulary`)."""
    return FairseqVocabulary.holds(directory)


def write_vocabulary(vocab: FairseqVocabulary, added: list, directory: str) -> None:
    """`write` into an existing empty ``directory`` (`Family.write_vocabulary`)."""
    write(vocab, added, os.fspath(directory))


def tokenizer_files(vocab: FairseqVocabulary) -> dict[str, str]:
    """Its SentencePiece model by its name in a model directory ({} for a directory of
    tokenizer.json alone) (`Family.tokenizer_files`)."""
    path = os.path.join(vocab.directory, SPM_FILE)
    return {SPM_FILE: path} if os.path.isfile(path) else {}
