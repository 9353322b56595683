"""NLLB-200's and mBART-50's tokenizer built as transformers 5 builds it, with the `tokenizers`
library (imported here only, when such a vocabulary is read).

transformers 5 no longer segments these two with SentencePiece: ``NllbTokenizer`` and
``MBart50Tokenizer`` are ``TokenizersBackend`` classes that read the pieces out of
``sentencepiece.bpe.model`` (or out of ``tokenizer.json``'s model) and segment with a
`tokenizers.Tokenizer` of their own making:

- NLLB-200: a BPE model over fairseq's ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3,
  then every other piece in SentencePiece's order, at its SentencePiece id + 1), its merges
  generated from the pieces (`_merges`, transformers' ``generate_merges``);
- mBART-50: a Unigram model over the same ids with the pieces' scores, its 52 language codes
  and ``<mask>`` after the pieces;
- both: SentencePiece's character map and runs of spaces replaced by one (the normalizer), and
  a Metaspace pre-tokenizer that puts ``▁`` before every word (``prepend_scheme='always'``).

So this module builds the same `tokenizers.Tokenizer`, and its ids are theirs on every line
(where plain SentencePiece differs: a trailing space becomes a ``▁`` piece, mBART-50's Unigram
segments otherwise than its BPE model did). The tokens after the pieces are registered as
transformers 5 registers them, in its order (`register`): tokenizer_config.json's
``added_tokens_decoder`` by id, then the named special tokens it lacks (``<mask>``), then the
extra special tokens (the language codes).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from transformer.data import DataError
from transformer.interop.fairseq_codes import MBART50_CODES

BOS, PAD, EOS, UNK, MASK = '<s>', '<pad>', '</s>', '<unk>', '<mask>'
FAIRSEQ_SPECIAL = (BOS, PAD, EOS, UNK)  # fairseq's dictionary: ids 0, 1, 2, 3
SPACE = '\u2581'  # SentencePiece's word boundary, '▁'
# The model each family's tokenizer is, and the named special tokens in the order transformers
# registers them (SPECIAL_TOKENS_ATTRIBUTES: bos, eos, unk, sep, pad, cls, mask).
MODELS = {'nllb': 'BPE', 'mbart50': 'Unigram'}
NAMED = ('bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token')
DEFAULTS = {
    'bos_token': BOS,
    'eos_token': EOS,
    'unk_token': UNK,
    'sep_token': EOS,
    'pad_token': PAD,
    'cls_token': BOS,
    'mask_token': MASK,
}


def from_spm(kind: str, proto: bytes, path: str) -> tuple[Any, Any]:
    """(the model, the character map) of ``kind``'s tokenizer from a SentencePiece model's
    bytes (``proto``, read from ``path``)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    try:
        model.ParseFromString(proto)
    except Exception as e:  # protobuf's DecodeError, whichever implementation
        raise DataError(f'{path} is not a SentencePiece model that loads ({e}).') from None
    if not model.pieces:
        raise DataError(f"{path} holds no pieces: restore the directory's file.")
    scored = [(p.piece, p.score) for p in model.pieces]
    charsmap = model.normalizer_spec.precompiled_charsmap or None
    if kind == 'nllb':
        vocab = {piece: i for i, piece in enumerate(FAIRSEQ_SPECIAL)}
        for piece, _ in scored:
            vocab.setdefault(piece, len(vocab))
        return _bpe(vocab, _merges([p for p, _ in scored])), charsmap
    return _unigram(_mbart_scores(scored[3:])), charsmap


def from_json(kind: str, content: bytes, path: str) -> tuple[Any, Any]:
    """(the model, the character map) of ``kind``'s tokenizer from tokenizer.json's bytes, as
    transformers 5 rebuilds it: its model's pieces (and merges), its character map."""
    try:
        data = json.loads(content.decode('utf-8'))
        model = data['model']
        vocab = model['vocab']
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f'{path} is not a tokenizer.json with a model and its vocab ({e}).'
        ) from None
    want = MODELS[kind]
    if model.get('type') != want:
        raise DataError(
            f"{path} holds a {model.get('type')} model; this family's tokenizer is a {want} model."
        )
    charsmap = _charsmap(data.get('normalizer'))
    if kind == 'nllb':
        if isinstance(vocab, list):
            vocab = {v[0] if isinstance(v, list) else v: i for i, v in enumerate(vocab)}
        merges = [tuple(m.split(' ')) if isinstance(m, str) else tuple(m) for m in model['merges']]
        return _bpe(vocab, merges), charsmap
    scored = [(str(p), float(s)) for p, s in vocab]
    if not any(p in MBART50_CODES for p, _ in scored):  # SentencePiece's ids: reorder them
        scored = _mbart_scores(scored[3:])
    return _unigram(scored), charsmap


def _mbart_scores(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """mBART-50's Unigram vocabulary: fairseq's four, SentencePiece's pieces after its own
    three, the codes, ``<mask>`` (transformers' MBart50Converter)."""
    head = [(p, 0.0) for p in FAIRSEQ_SPECIAL]
    return head + pieces + [(c, 0.0) for c in MBART50_CODES] + [(MASK, 0.0)]


def _merges(pieces: list[str]) -> list[tuple[str, str]]:
    """BPE merges from SentencePiece's pieces in their order, as transformers'
    ``generate_merges`` makes them: every split of a piece into two pieces, ranked by the
    piece's id, then by the length of its left half (its order: the two halves of one split
    of one piece are told apart by that length, so the pieces' order, split by split, is
    already sorted)."""
    known = dict.fromkeys(pieces)
    return [
        (piece[:k], piece[k:])
        for piece in known
        for k in range(1, len(piece))
        if piece[:k] in known and piece[k:] in known
    ]


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Any:
    from tokenizers.models import BPE

    return BPE(
        vocab=vocab, merges=merges, dropout=None, unk_token=UNK, fuse_unk=True, byte_fallback=False
    )


def _unigram(scored: list[tuple[str, float]]) -> Any:
    from tokenizers.models import Unigram

    return Unigram(scored, unk_id=3, byte_fallback=False)


def _charsmap(normalizer: Any) -> bytes | None:
    """The SentencePiece character map of tokenizer.json's normalizer, or None."""
    if not isinstance(normalizer, dict):
        return None
    parts = normalizer.get('normalizers') if normalizer.get('type') == 'Sequence' else [normalizer]
    for part in parts or []:
        if isinstance(part, dict) and part.get('type') == 'Precompiled':
            return base64.b64decode(part.get('precompiled_charsmap') or '') or None
    return None


def tokenizer(kind: str, model: Any, charsmap: bytes | None) -> Any:
    """The `tokenizers.Tokenizer` of ``kind`` over ``model``, before any token is registered:
    transformers 5's normalizer (NLLB-200 has one only with a character map), pre-tokenizer
    and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

    out = Tokenizer(model)
    spaces = normalizers.Replace(Regex(r' {2,}'), ' ')
    steps = [normalizers.Precompiled(charsmap)] if charsmap else []
    if charsmap or kind == 'mbart50':
        out.normalizer = normalizers.Sequence([*steps, spaces])
    out.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme='always', split=True
    )
    out.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme='always', split=True)
    return out


def register(backend: Any, config: dict[str, Any], codes: Sequence[str]) -> None:
    """Registers on ``backend`` the tokens transformers 5 registers, in its order: the entries
    of tokenizer_config.json's (``config``) ``added_tokens_decoder`` by id, the named special
    tokens (``<mask>`` is the one that is no piece), then ``codes`` (the extra special tokens).
    A token that is a piece keeps the piece's id; any other takes the next id."""
    from tokenizers import AddedToken

    tokens: list[Any] = []
    for _, entry in sorted(entries(config), key=lambda e: e[0]):
        tokens.append(AddedToken(**entry))
    for name in NAMED:
        value = config.get(name, DEFAULTS[name])
        if value is None:
            continue
        if isinstance(value, dict):
            flags = {k: v for k, v in value.items() if k != '__type'}
            tokens.append(AddedToken(**{**flags, 'special': True}))
        elif name == 'mask_token':  # both families' own flags: it takes the space before it
            tokens.append(AddedToken(value, lstrip=True, normalized=True, special=True))
        else:
            tokens.append(AddedToken(value, special=True))
    tokens += [AddedToken(code, special=True) for code in codes]
    seen, unique = set(), []
    for token in tokens:
        if token.content not in seen:
            seen.add(token.content)
            unique.append(token)
    backend.add_tokens(unique)


def entries(config: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(id, AddedToken fields) of each entry of tokenizer_config.json's
    ``added_tokens_decoder``."""
    found = config.get('added_tokens_decoder') or {}
    if not isinstance(found, dict):
        return []
    out = []
    fields = ('content', 'single_word', 'lstrip', 'rstrip', 'normalized', 'special')
    for key, entry in found.items():
        entry = {'content': entry} if isinstance(entry, str) else entry
        if str(key).isdigit() and isinstance(entry, dict) and 'content' in entry:
            out.append((int(key), {k: entry[k] for k in fields if k in entry}))
    return out
