"""The files of an NLLB-200, M2M100 or mBART-50 vocabulary read into one `Table` (every token
by id, the language codes, how text becomes ids and ids text), with transformers 5's ids:
fairseq_vocab.py's `FairseqVocabulary` holds it.

- NLLB-200 and mBART-50: ``sentencepiece.bpe.model`` or ``tokenizer.json`` (the one transformers
  5 saves, preferred where both are, as transformers prefers it), segmented by the tokenizer
  transformers 5 builds (fairseq_backend.py);
- M2M100: ``vocab.json`` (fairseq's dictionary: the ids) and ``sentencepiece.bpe.model`` (the
  segmentation), read as ``M2M100Tokenizer`` reads them: pieces looked up in vocab.json (a piece
  it lacks is ``<unk>``), the codes ``__en__`` ... after its last id, in the order of
  tokenizer_config.json's ``language_codes`` list (fairseq_codes.py).

tokenizer_config.json names the family (``tokenizer_class``; the constructor's ``kind`` where
it does not) and the codes of an NLLB-200 directory (``extra_special_tokens`` or
``additional_special_tokens``): transformers 5 reading ``sentencepiece.bpe.model`` alone gives an
NLLB-200 tokenizer no codes unless they are listed there, so a directory without them is
refused; from ``tokenizer.json`` it falls back on the 202 FLORES-200 codes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from transformer.data import DataError
from transformer.interop import fairseq_backend as backend
from transformer.interop.fairseq_backend import FAIRSEQ_SPECIAL, UNK
from transformer.interop.fairseq_codes import M2M100_CODES, MBART50_CODES, NLLB_CODES, m2m100_token
from transformer.interop.json_files import in_id_order, piece_ids, read_object

SPM_FILE = 'sentencepiece.bpe.model'
TOKENIZER_JSON = 'tokenizer.json'
VOCAB_JSON = 'vocab.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'
TITLES = {'nllb': 'NLLB-200', 'm2m100': 'M2M100', 'mbart50': 'mBART-50'}
# tokenizer_config.json's tokenizer_class -> the family's vocabulary.
CLASSES = {
    'NllbTokenizer': 'nllb',
    'NllbTokenizerFast': 'nllb',
    'M2M100Tokenizer': 'm2m100',
    'MBart50Tokenizer': 'mbart50',
    'MBart50TokenizerFast': 'mbart50',
}
CLASS_OF = {'nllb': 'NllbTokenizer', 'm2m100': 'M2M100Tokenizer', 'mbart50': 'MBart50Tokenizer'}
# What each family's language codes look like: a registered special token of this form is a
# code (a code added to the vocabulary too).
CODE_FORMS = {
    'nllb': re.compile(r'[a-z]{3}_[A-Z][a-z]{3}'),
    'm2m100': re.compile(r'__[a-z]{2,3}__'),
    'mbart50': re.compile(r'[a-z]{2}_[A-Z]{2}'),
}
# The same shapes as the messages name them.
CODE_SHAPES = {
    'nllb': 'xxx_Xxxx (eng_Latn)',
    'm2m100': '__xx__ or __xxx__ (__en__)',
    'mbart50': 'xx_XX (en_XX)',
}


@dataclasses.dataclass
class Table:
    """A vocabulary's files read, in transformers 5's ids.

    Attributes:
      kind: 'nllb', 'm2m100' or 'mbart50'.
      pieces: the token of each id (every id the tokenizer has).
      codes: the language codes, in id order.
      special: the ids decoding skips (fairseq's four, the codes, ``<mask>``, added tokens).
      registered: the ids of the tokens its tokenizer cuts out of the text, which its files
        register (M2M100's codes only where tokenizer_config.json lists them as special
        tokens, as the hub's files do: transformers 5 reads ``__fr__`` in the text as text
        otherwise).
      contents: the bytes of the files that give the ids, for a fingerprint.
      encode: (texts) -> the ids of each, without prefix or suffix, special-token strings
        in the text taken as the tokens.
      decode: (ids) -> text, the special ids skipped.
      config: tokenizer_config.json ({} without one).
    """

    kind: str
    pieces: list[str]
    codes: list[str]
    special: set[int]
    registered: set[int]
    contents: list[bytes]
    encode: Callable[[Sequence[str]], list[list[int]]]
    decode: Callable[[list[int]], str]
    config: dict[str, Any]


def tokenizer_config(directory: str) -> dict[str, Any]:
    """tokenizer_config.json ({} without one)."""
    path = os.path.join(directory, TOKENIZER_CONFIG)
    return read_object(path) if os.path.isfile(path) else {}


def kind_of(directory: str, config: dict[str, Any], kind: str | None, where: str) -> str:
    """The family of the vocabulary in ``directory``: ``kind`` where given, else
    tokenizer_config.json's ``tokenizer_class``, else M2M100 where a vocab.json is beside the
    SentencePiece model."""
    named = CLASSES.get(str(config.get('tokenizer_class')))
    if kind is not None and kind not in TITLES:
        raise ValueError(f'kind must be one of {tuple(TITLES)}, got {kind!r}.')
    if kind is not None and named is not None and named != kind:
        raise DataError(
            f"{where}: tokenizer_config.json's tokenizer_class "
            f'{config["tokenizer_class"]!r} is not an {TITLES[kind]} tokenizer.'
        )
    found = kind or named
    if found is None and os.path.isfile(os.path.join(directory, VOCAB_JSON)):
        found = 'm2m100'
    if found is None:
        raise DataError(
            f'{where}: tokenizer_config.json names no tokenizer_class of {", ".join(CLASSES)}; '
            'restore the file the model came with.'
        )
    return found


def files_of(directory: str, kind: str) -> tuple[str, ...]:
    """The files that hold ``kind``'s vocabulary in ``directory``: M2M100's vocab.json and
    SentencePiece model; NLLB-200's and mBART-50's tokenizer.json where there is one (what
    transformers 5 reads first), else their SentencePiece model."""
    if kind == 'm2m100':
        return (VOCAB_JSON, SPM_FILE)
    if os.path.isfile(os.path.join(directory, TOKENIZER_JSON)):
        return (TOKENIZER_JSON,)
    return (SPM_FILE,)


def _read(directory: str, names: Sequence[str], kind: str, where: str) -> list[bytes]:
    contents = []
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            need = 'vocab.json and sentencepiece.bpe.model'
            if kind != 'm2m100':
                need = 'sentencepiece.bpe.model or tokenizer.json'
            raise DataError(
                f'{path} does not exist: an {TITLES[kind]} vocabulary ({where}) is {need}.'
            )
        with open(path, 'rb') as f:
            contents.append(f.read())
        if not contents[-1]:
            raise DataError(f"{path} is empty: restore the directory's file.")
    return contents


def read_table(directory: str, kind: str | None, where: str) -> Table:
    """The vocabulary in ``directory`` (module docstring); one-line `DataError`s."""
    config = tokenizer_config(directory)
    kind = kind_of(directory, config, kind, where)
    if kind == 'nllb' and config.get('legacy_behaviour') is True:
        raise DataError(
            f'{where}: tokenizer_config.json sets legacy_behaviour=true (the code after the '
            "text's </s>); only the layout [code] X </s> is read: set it to false."
        )
    names = files_of(directory, kind)
    contents = _read(directory, names, kind, where)
    if kind == 'm2m100':
        return _m2m100(directory, config, contents)
    return _tokenizers_table(directory, kind, config, names[0], contents)


def _tokenizers_table(
    directory: str, kind: str, config: dict[str, Any], name: str, contents: list[bytes]
) -> Table:
    """An NLLB-200 or mBART-50 vocabulary, with the tokenizer transformers 5 builds."""
    path = os.path.join(directory, name)
    read = backend.from_json if name == TOKENIZER_JSON else backend.from_spm
    model, charsmap = read(kind, contents[0], path)
    tokenizer = backend.tokenizer(kind, model, charsmap)
    listed = config.get('extra_special_tokens') or config.get('additional_special_tokens')
    if kind == 'mbart50':
        codes = [*MBART50_CODES, *_strings(listed)]
    elif listed:
        codes = _strings(listed)
    elif name == TOKENIZER_JSON:
        codes = list(NLLB_CODES)
    else:
        raise DataError(
            f'{path}: {TOKENIZER_CONFIG} lists no language codes (extra_special_tokens), and '
            'transformers 5 gives an NLLB-200 tokenizer read from sentencepiece.bpe.model alone '
            'none: restore the file the model came with, or list the codes there.'
        )
    backend.register(tokenizer, config, codes)
    for i, entry in backend.entries(config):
        if tokenizer.token_to_id(entry['content']) != i:
            raise DataError(
                f'{os.path.join(directory, TOKENIZER_CONFIG)}: added_tokens_decoder puts '
                f'{entry["content"]!r} at id {i}, where transformers 5 gives it id '
                f'{tokenizer.token_to_id(entry["content"])}: make the files agree.'
            )
    pieces = [''] * tokenizer.get_vocab_size(with_added_tokens=True)
    for piece, i in tokenizer.get_vocab(with_added_tokens=True).items():
        pieces[i] = piece
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    contents.append(json.dumps([kind, sorted((i, pieces[i]) for i in special)]).encode())
    clean = bool(config.get('clean_up_tokenization_spaces')) and kind == 'mbart50'

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(ids: list[int]) -> str:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return clean_up(text) if clean else text

    codes = _codes(kind, pieces, special)
    return Table(kind, pieces, codes, special, special, contents, encode, decode, config)


def _strings(values: Any) -> list[str]:
    if not isinstance(values, list):
        return []
    return [v.get('content') if isinstance(v, dict) else str(v) for v in values]


def _codes(kind: str, pieces: list[str], special: set[int]) -> list[str]:
    form = CODE_FORMS[kind]
    return [pieces[i] for i in sorted(special) if form.fullmatch(pieces[i])]


def clean_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (a decode of a tokenizer whose config sets
    ``clean_up_tokenization_spaces``)."""
    for before, after in (
        (' .', '.'),
        (' ?', '?'),
        (' !', '!'),
        (' ,', ','),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


def _m2m100(directory: str, config: dict[str, Any], contents: list[bytes]) -> Table:
    """An M2M100 vocabulary, read as ``M2M100Tokenizer`` reads it (module docstring)."""
    encoder = _read_vocab(os.path.join(directory, VOCAB_JSON), contents[0])
    spm = load_spm(os.path.join(directory, SPM_FILE), contents[1])
    name = config.get('language_codes', 'm2m100')
    if name not in M2M100_CODES:
        raise DataError(
            f'{os.path.join(directory, TOKENIZER_CONFIG)}: language_codes={name!r} is not one of '
            f"M2M100Tokenizer's lists {tuple(M2M100_CODES)}."
        )
    pieces = encoder + [m2m100_token(c) for c in M2M100_CODES[name]]
    known = len(pieces)
    pieces += _appended(config, pieces, directory)
    ids = {piece: i for i, piece in enumerate(pieces)}
    registered = {*range(len(FAIRSEQ_SPECIAL)), *range(known, len(pieces))}
    registered |= {i for i, _ in backend.entries(config)}
    # The hub's files list the codes as special tokens, which makes transformers 5 cut them out
    # of the text; without the list it reads them as text.
    listed = _strings(config.get('extra_special_tokens') or config.get('additional_special_tokens'))
    if missing := [t for t in listed if t not in ids]:
        raise DataError(
            f'{os.path.join(directory, TOKENIZER_CONFIG)} lists the special tokens {missing[:3]}, '
            'which are no tokens of vocab.json or the codes: register them in '
            'added_tokens_decoder at their ids.'
        )
    registered |= {ids[t] for t in listed}
    special = registered | set(range(len(encoder), known))
    cut = _cutter([pieces[i] for i in registered])
    unk = ids[UNK]
    contents.append(json.dumps(['m2m100', pieces[len(encoder) :]]).encode())
    clean = bool(config.get('clean_up_tokenization_spaces'))

    def encode(texts: Sequence[str]) -> list[list[int]]:
        parts = [[c for c in cut.split(text) if c] for text in texts]
        plain = [c for split in parts for c in split if ids.get(c) not in registered]
        segmented = iter(spm.encode(plain, out_type=str))
        out = []
        for split in parts:
            row = []
            for chunk in split:
                if chunk in ids and ids[chunk] in registered:
                    row.append(ids[chunk])
                else:
                    row += [ids.get(p, unk) for p in next(segmented)]
            out.append(row)
        return out

    def decode(token_ids: list[int]) -> str:
        text = spm.decode_pieces([pieces[i] for i in token_ids if i not in special]).strip()
        return clean_up(text) if clean else text

    codes = _codes('m2m100', pieces, special)
    return Table('m2m100', pieces, codes, special, registered, contents, encode, decode, config)


def _cutter(tokens: Sequence[str]) -> re.Pattern:
    """Splits text around ``tokens`` (the longest match first), keeping them."""
    ordered = sorted(set(tokens), key=len, reverse=True)
    return re.compile('(' + '|'.join(re.escape(t) for t in ordered) + ')')


def _appended(config: dict[str, Any], pieces: list[str], directory: str) -> list[str]:
    """The tokens tokenizer_config.json's ``added_tokens_decoder`` registers after ``pieces``
    (vocab.json's and the codes), which must take the ids that follow them one by one; a
    registered token inside them must be the piece of its id."""
    path = os.path.join(directory, TOKENIZER_CONFIG)
    extra = {}
    for i, entry in backend.entries(config):
        content = entry['content']
        if i < len(pieces):
            if pieces[i] != content:
                raise DataError(
                    f'{path}: added_tokens_decoder puts {content!r} at id {i}, where vocab.json '
                    f'and the codes hold {pieces[i]!r}: make the files agree.'
                )
            continue
        extra[i] = content
    if sorted(extra) != list(range(len(pieces), len(pieces) + len(extra))):
        raise DataError(
            f'{path}: added_tokens_decoder registers ids {sorted(extra)[:4]}..., not the ids '
            f'after the {len(pieces)} of vocab.json and the codes one by one.'
        )
    return [extra[i] for i in sorted(extra)]


def _read_vocab(path: str, content: bytes) -> list[str]:
    """vocab.json's pieces by id: ids 0 .. n - 1, fairseq's ``<s>``, ``<pad>``, ``</s>``,
    ``<unk>`` at 0 .. 3."""
    pieces = in_id_order(path, piece_ids(path, content))
    held = pieces[: len(FAIRSEQ_SPECIAL)]
    if held != list(FAIRSEQ_SPECIAL):
        raise DataError(f"{path} holds {held} at ids 0..3, not fairseq's {list(FAIRSEQ_SPECIAL)}.")
    return pieces


def load_spm(path: str, proto: bytes):
    """The SentencePiece model in ``proto`` (read from ``path``)."""
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as e:
        raise DataError(f'{path} is not a SentencePiece model that loads ({e}).') from None
