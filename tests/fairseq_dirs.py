"""Small NLLB-200, M2M100 and mBART-50 tokenizer directories, built offline, as their hub
repositories hold them and as transformers 5 saves them.

One SentencePiece BPE model (SentencePiece's own ids: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2) is
trained on a few hundred English and German lines of Multi30k (``../shared/data/multi30k``;
the synthetic pair where it is absent), and each directory is built around it:

- ``nllb``: ``sentencepiece.bpe.model`` and a tokenizer_config.json naming ``NllbTokenizer``
  and the 202 codes (``extra_special_tokens``, without which transformers 5 gives the
  tokenizer no codes);
- ``m2m100``: ``vocab.json`` (fairseq's dictionary: ``<s>``, ``<pad>``, ``</s>``, ``<unk>``, then
  the pieces in an order that is not SentencePiece's, a few of them left out so they read as
  ``<unk>``: `LEFT_OUT`) beside the model, and a tokenizer_config.json naming
  ``M2M100Tokenizer`` and listing the codes (``additional_special_tokens``), as the hub's do;
- ``m2m100_bare``: the same without the list, which transformers 5 reads otherwise: the codes
  are no special tokens (``__fr__`` in the text is text, decoding keeps their text);
- ``nllb_hub``: as the hub's NLLB-200 repositories register their tokens: the codes listed in
  ``additional_special_tokens`` and every token past the pieces at its id in
  ``added_tokens_decoder``, the codes first and ``<mask>`` last (where the ``nllb`` directory,
  read by transformers 5, puts ``<mask>`` before the codes);
- ``mbart50``: the model and a tokenizer_config.json naming ``MBart50Tokenizer``;
- ``nllb_json``, ``mbart50_json``: what transformers 5's ``save_pretrained`` writes of the
  first and the last, ``sentencepiece.bpe.model`` removed: ``tokenizer.json`` alone.

Built in ~2 s; tests share one build per session (`fairseq_dirs`).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
from types import SimpleNamespace

from tests.shared_dirs import built_once
from transformer.data import synthetic
from transformer.interop.fairseq_codes import M2M100_CODES, NLLB_CODES, m2m100_token

MULTI30K = pathlib.Path(
    os.environ.get(
        'MULTI30K_DIR', pathlib.Path(__file__).parents[2] / 'shared' / 'data' / 'multi30k'
    )
)
SPM_FILE = 'sentencepiece.bpe.model'
PIECES = 400  # the SentencePiece model's
LINES = 300  # of each language
LEFT_OUT = ('▁the', '▁und', 'ing')  # real pieces vocab.json lacks, where the model has them
KINDS = ('nllb', 'm2m100', 'mbart50')
CLASSES = {'nllb': 'NllbTokenizer', 'm2m100': 'M2M100Tokenizer', 'mbart50': 'MBart50Tokenizer'}


def lines(count: int = LINES) -> list[tuple[str, str]]:
    """``count`` (English, German) pairs of Multi30k's training split, or synthetic pairs."""
    if (MULTI30K / 'train.en').is_file():
        texts = [
            (MULTI30K / f'train.{lang}').read_text(encoding='utf-8').splitlines()[:count]
            for lang in ('en', 'de')
        ]
        return list(zip(*texts, strict=True))
    cfg = SimpleNamespace(seed=0, num_train=count, num_validation=1, num_test=1, max_words=10)
    sources, targets = synthetic.read(SimpleNamespace(synthetic=cfg), 'train')
    return list(zip(sources, targets, strict=True))


def _train_spm(texts: list[str]) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=PIECES,
        model_type='bpe',
        character_coverage=0.9995,  # rare characters are unknown, as in the real models
        hard_vocab_limit=False,
        input_sentence_size=0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def _write(directory: pathlib.Path, proto: bytes, config: dict, vocab: dict | None = None):
    directory.mkdir(parents=True)
    (directory / SPM_FILE).write_bytes(proto)
    (directory / 'tokenizer_config.json').write_text(json.dumps(config, indent=2))
    if vocab is not None:
        (directory / 'vocab.json').write_text(json.dumps(vocab, ensure_ascii=False, indent=2))


def _m2m100_vocab(proto: bytes) -> dict[str, int]:
    """fairseq's dictionary of the model's pieces: its four, then the pieces sorted by their
    text (not SentencePiece's order), `LEFT_OUT` left out."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces = sorted(sp.id_to_piece(i) for i in range(3, sp.get_piece_size()))
    kept = ['<s>', '<pad>', '</s>', '<unk>', *(p for p in pieces if p not in LEFT_OUT)]
    return {piece: i for i, piece in enumerate(kept)}


def _hub_config(proto: bytes) -> dict:
    """The NLLB-200 hub's tokenizer_config.json for ``proto`` (module docstring)."""
    import sentencepiece as spm

    first = spm.SentencePieceProcessor(model_proto=proto).get_piece_size() + 1  # fairseq's ids
    tokens = ['<s>', '<pad>', '</s>', '<unk>']
    ids = [*range(4), *range(first, first + len(NLLB_CODES) + 1)]
    tokens += [*NLLB_CODES, '<mask>']
    entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    registered = {str(i): {**entry, 'content': t} for i, t in zip(ids, tokens, strict=True)}
    registered[str(ids[-1])].update(lstrip=True, normalized=True)
    return {
        'tokenizer_class': CLASSES['nllb'],
        'additional_special_tokens': list(NLLB_CODES),
        'added_tokens_decoder': registered,
    }


def build(path: pathlib.Path) -> None:
    """Writes the directories (module docstring) under ``path``."""
    import transformers

    pairs = lines()
    proto = _train_spm([t for pair in pairs for t in pair])
    nllb = {'tokenizer_class': CLASSES['nllb'], 'extra_special_tokens': list(NLLB_CODES)}
    _write(path / 'nllb', proto, nllb)
    _write(path / 'nllb_hub', proto, _hub_config(proto))
    m2m100 = {'tokenizer_class': CLASSES['m2m100'], 'language_codes': 'm2m100'}
    _write(path / 'm2m100_bare', proto, m2m100, _m2m100_vocab(proto))
    codes = [m2m100_token(c) for c in M2M100_CODES['m2m100']]
    m2m100 |= {'num_madeup_words': 8, 'additional_special_tokens': codes}
    _write(path / 'm2m100', proto, m2m100, _m2m100_vocab(proto))
    _write(path / 'mbart50', proto, {'tokenizer_class': CLASSES['mbart50']})
    for kind in ('nllb', 'mbart50'):
        theirs = getattr(transformers, CLASSES[kind]).from_pretrained(path / kind)
        saved = path / f'{kind}_json'
        theirs.save_pretrained(saved)
        (saved / SPM_FILE).unlink(missing_ok=True)


def fairseq_dirs(tmp_path_factory) -> pathlib.Path:
    """The directories of `build`, built once per test session (tests/shared_dirs.py); read
    them only."""
    return built_once(tmp_path_factory, 'fairseq-tokenizers', build)
