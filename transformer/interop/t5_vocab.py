"""T5's vocabulary (T5, T5 v1.1, MADLAD-400) behind the interface of the joint SentencePiece
`Tokenizer`: its SentencePiece model (``spiece.model``) or, in a directory without one, its
``tokenizer.json`` (read with the ``tokenizers`` library), with the ids used as they are.

T5's ids are this project's joint ones (transformer/tokens.py, `JOINT`): pad 0 (also the
decoder's start), eos 1, unk 2, so no permutation is needed. After the SentencePiece pieces
transformers adds ``extra_ids`` sentinels (100; tokenizer_config.json's ``extra_ids``), in
reverse: ``<extra_id_N>`` is id ``pieces + extra_ids - 1 - N``. The model may have more rows
still (T5 v1.1's 32128 for 32100 ids): config.json's ``vocab_size`` is the vocabulary's size
here (`rows`), and the ids past the sentinels have no text.

MADLAD-400's target-language tags (``<2de>``) are pieces of its SentencePiece model:
``--source_tag '<2de>'`` puts that piece's id first (transformer/data/source_tag.py), which is
what transformers' ``T5Tokenizer`` gives for ``'<2de> ' + text``. `encode` gives the ids
without eos, as every vocabulary here does; the pipeline appends it, as T5Tokenizer does.
A tag typed inside the text is read as SentencePiece reads it from spiece.model (T5Tokenizer
cuts it out first, so the piece after it may differ): give it with --source_tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from transformer.data import DataError, Pretokenizer, Side
from transformer.tokens import JOINT, SpecialIds

SPM_FILE = 'spiece.model'
TOKENIZER_JSON = 'tokenizer.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
TOKENIZER_CLASS = 'T5Tokenizer'
EXTRA_IDS = 100  # transformers' default number of sentinels
# tokenizer_config.json's record of the model's rows where they are more than the pieces and
# sentinels (`copy_to`): a run's copy reads back with the model's vocabulary size.
ROWS_KEY = 'model_rows'


def _read_config(directory: str) -> dict[str, Any]:
    """tokenizer_config.json as read ({} without one or unreadable)."""
    try:
        with open(os.path.join(directory, TOKENIZER_CONFIG), encoding='utf-8') as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class _SentencePiece:
    """spiece.model's pieces, encoding and decoding."""

    def __init__(self, path: str, where: str):
        import sentencepiece as spm

        with open(path, 'rb') as f:
            self.content = f.read()
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=self.content)
        except RuntimeError as e:
            raise DataError(f'{where}: {SPM_FILE} does not load ({e}).') from None
        self.size = self.sp.get_piece_size()
        self.special = (self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id())

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts))

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)

    def piece(self, i: int) -> str:
        return self.sp.id_to_piece(i)

    def piece_id(self, piece: str) -> int | None:
        i = self.sp.piece_to_id(piece)
        return None if i == JOINT.unk and piece != self.sp.id_to_piece(i) else i


class _TokenizerJson:
    """tokenizer.json's pieces (the sentinels it adds left out of `size`), encoding and
    decoding with the ``tokenizers`` library."""

    def __init__(self, path: str, where: str, extra_ids: int):
        import tokenizers

        with open(path, 'rb') as f:
            self.content = f.read()
        try:
            self.tok = tokenizers.Tokenizer.from_str(self.content.decode('utf-8'))
        except Exception as e:  # tokenizers raises its own Exception types
            raise DataError(f'{where}: {TOKENIZER_JSON} does not load ({e}).') from None
        sentinels = sum(
            1 for i in range(extra_ids) if self.tok.token_to_id(f'<extra_id_{i}>') is not None
        )
        self.size = self.tok.get_vocab_size(with_added_tokens=True) - sentinels
        self.special = tuple(self.tok.token_to_id(t) for t in ('<pad>', '</s>', '<unk>'))

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def piece(self, i: int) -> str:
        return self.tok.id_to_token(i)

    def piece_id(self, piece: str) -> int | None:
        return self.tok.token_to_id(piece)


class T5Vocabulary:
    """T5's vocabulary in ``directory``: a `transformer.data.vocabulary.Vocabulary`.

    Attributes:
      directory: the directory it was read from.
      size: the SentencePiece pieces (the sentinels and padding rows not counted).
      extra_ids: the sentinels after the pieces.
      rows: V, the model's rows: at least ``size + extra_ids``.
      special: `JOINT` with ``never_emit`` added.
    """

    pretokenize = 'none'
    no_added_tokens = (
        "a T5 vocabulary takes no added tokens: its pieces (MADLAD-400's <2xx> tags included) "
        'and sentinels are used as they are.'
    )
    no_label_smoothing = None

    def __init__(
        self,
        directory: str | os.PathLike,
        key: str | None = None,
        data_config: Any = None,
        never_emit: Sequence[int] = (),
        rows: int | None = None,
    ):
        """``key``: the setting that named the directory, for the messages. ``data_config``:
        the ``data`` section (its ``pretokenize`` must be 'none'; its ``vocab_size`` is the
        rows when ``rows`` is None). ``never_emit``: ids no search may output besides pad.
        ``rows``: the model's embedding rows (config.json's ``vocab_size``)."""
        self.directory = os.fspath(directory)
        where = f'{key}={self.directory}' if key else self.directory
        self.config = _read_config(self.directory)
        extra_ids = self.config.get('extra_ids', EXTRA_IDS)
        self.extra_ids = extra_ids if isinstance(extra_ids, int) and extra_ids >= 0 else EXTRA_IDS
        spm_path = os.path.join(self.directory, SPM_FILE)
        json_path = os.path.join(self.directory, TOKENIZER_JSON)
        if os.path.isfile(spm_path):
            self._table = _SentencePiece(spm_path, where)
        elif os.path.isfile(json_path):
            self._table = _TokenizerJson(json_path, where, self.extra_ids)
        else:
            raise DataError(
                f'{where} holds neither {SPM_FILE} nor {TOKENIZER_JSON}: restore the T5 '
                'tokenizer files the model came with.'
            )
        self.size = self._table.size
        wanted = (JOINT.pad, JOINT.eos, JOINT.unk)
        if tuple(self._table.special) != wanted:
            raise DataError(
                f"{where}: its pad/eos/unk ids are {self._table.special}, not T5's {wanted}."
            )
        if rows is None and data_config is not None:
            rows = data_config.vocab_size
        if rows is None and isinstance(self.config.get(ROWS_KEY), int):
            rows = self.config[ROWS_KEY]  # a run's copy (`copy_to`)
        self.rows = self.size + self.extra_ids if rows is None else int(rows)
        if self.rows < self.size:
            raise DataError(
                f"{where}: the model has {self.rows} embedding rows (config.json's vocab_size), "
                f'fewer than the {self.size} pieces of its tokenizer: the tokenizer files are '
                "not the model's."
            )
        self.special = SpecialIds(**{**vars(JOINT), 'never_emit': (*JOINT.never_emit, *never_emit)})
        if self.special.largest() >= self.rows:
            raise DataError(f'{where}: never_emit={tuple(never_emit)} names ids past {self.rows}.')
        if data_config is not None and data_config.pretokenize != 'none':
            raise DataError(
                f'{where} is a T5 vocabulary, which reads raw text: set data.pretokenize=none, '
                f'not {data_config.pretokenize!r}.'
            )
        digest = hashlib.sha256(f'{self.rows},{self.extra_ids}'.encode())
        digest.update(self._table.content)
        self.fingerprint = digest.hexdigest()[:16]
        self.pretokenizer = Pretokenizer('none', None, None, False)

    @property
    def vocab_size(self) -> int:
        return self.rows

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        """Ids of ``text``, without eos: transformers' T5Tokenizer's before its ``</s>``."""
        return self.encode_batch([text], side)[0]

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        """Ids of many texts of one side (one vocabulary serves both), without eos."""
        return self._table.encode(texts)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first eos; pad, the sentinels and the rows past them
        skipped (transformers' ``skip_special_tokens=True``)."""
        kept = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == JOINT.eos:
                break
            if i < self.size and i not in self.special.never_emit:
                kept.append(i)
        return self._table.decode(kept)

    def id_to_piece(self, i: int, side: Side = 'target') -> str:
        """The piece of id ``i``: a sentinel ``<extra_id_N>``, or '' for a padding row."""
        if not 0 <= i < self.rows:
            raise IndexError(f'id {i} is not below the vocabulary size {self.rows}.')
        if i < self.size:
            return self._table.piece(i)
        n = self.size + self.extra_ids - 1 - i
        return f'<extra_id_{n}>' if n >= 0 else ''

    def token_id(self, piece: str) -> int | None:
        """The id of ``piece`` (a piece such as MADLAD-400's ``<2de>``, or a sentinel)."""
        if piece.startswith('<extra_id_') and piece.endswith('>'):
            n = piece[len('<extra_id_') : -1]
            if n.isdigit() and int(n) < self.extra_ids:
                i = self.size + self.extra_ids - 1 - int(n)
                return i if i < self.rows else None
        return self._table.piece_id(piece)

    def language_tokens(self) -> list[str]:
        """[]: MADLAD-400's ``<2xx>`` tags are ordinary pieces, named with --source_tag."""
        return []

    @staticmethod
    def holds(directory: str | os.PathLike) -> bool:
        """Whether ``directory`` holds a T5 vocabulary: spiece.model, or tokenizer.json with
        a tokenizer_config.json naming T5Tokenizer (T5TokenizerFast); never raises."""
        directory = os.fspath(directory)
        if os.path.isfile(os.path.join(directory, SPM_FILE)):
            return True
        named = str(_read_config(directory).get('tokenizer_class', ''))
        has_json = os.path.isfile(os.path.join(directory, TOKENIZER_JSON))
        return has_json and named.removesuffix('Fast') == TOKENIZER_CLASS

    def files(self) -> dict[str, str]:
        """Its tokenizer files by name: spiece.model and/or tokenizer.json."""
        names = (SPM_FILE, TOKENIZER_JSON)
        paths = {name: os.path.join(self.directory, name) for name in names}
        return {name: path for name, path in paths.items() if os.path.isfile(path)}

    def copy_to(self, directory: str | os.PathLike) -> None:
        """Copies its tokenizer files into ``directory`` (a run's ``vocab/``, an export) with
        a tokenizer_config.json naming T5Tokenizer, its extra_ids and the model's rows past
        them (`ROWS_KEY`); files there are kept."""
        directory = os.fspath(directory)
        for name, path in self.files().items():
            if not os.path.exists(os.path.join(directory, name)):
                shutil.copyfile(path, os.path.join(directory, name))
        config_path = os.path.join(directory, TOKENIZER_CONFIG)
        if not os.path.exists(config_path):
            config = {**self.config, 'tokenizer_class': TOKENIZER_CLASS}
            config['extra_ids'] = self.extra_ids
            if self.rows != self.size + self.extra_ids:
                config[ROWS_KEY] = self.rows
            with open(config_path, 'w', encoding='utf-8') as f:
                json.dump(config, f, indent=2)


def load_vocabulary(
    directory: str, key: str | None = None, data_config: Any = None, never_emit=()
) -> T5Vocabulary:
    """The vocabulary in ``directory`` (`Family.load_vocabulary`): a run's copy, its rows the
    run's ``data.vocab_size``."""
    return T5Vocabulary(directory, key, data_config, never_emit)


def write_vocabulary(vocab: T5Vocabulary, added: list, directory: str) -> None:
    """Its files into an existing empty ``directory`` (`Family.write_vocabulary`); a one-line
    `DataError` for tokens to add (T5's vocabulary takes none here)."""
    if added:
        raise DataError(f'train.add_tokens: {vocab.no_added_tokens}')
    vocab.copy_to(directory)


def tokenizer_files(vocab: T5Vocabulary) -> dict[str, str]:
    """Its SentencePiece model by its name in a model directory ({} for a directory of
    tokenizer.json alone) (`Family.tokenizer_files`: what the CTranslate2 export copies)."""
    path = os.path.join(vocab.directory, SPM_FILE)
    return {SPM_FILE: path} if os.path.isfile(path) else {}
