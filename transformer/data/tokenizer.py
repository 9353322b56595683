"""A joint SentencePiece vocabulary of both languages, trained on the training split.

The paper shares one BPE vocabulary of ~37000 tokens between English and German (Sec. 5.1),
which is also what lets the source embedding, target embedding and pre-softmax matrix be one
(Sec. 3.4). Its ids are transformer/tokens.py's (`tokens.JOINT`): 0 = padding (and decoder
start), 1 = end of sentence, 2 = unknown; there is no beginning-of-sentence token. With
``data.pretokenize='moses'`` the vocabulary is trained on, and reads, Moses-tokenized text
(pretokenize.py).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
from absl import logging

from transformer.data import mix_entries
from transformer.data.errors import DataError
from transformer.data.pretokenize import MOSES_MARK, Pretokenizer, Side
from transformer.data.sources import read_chunks
from transformer.tokens import EOS_ID, JOINT, PAD_ID, UNK_ID

FILE = 'spm.model'  # its name in a run's vocab/ directory (`Tokenizer.copy_to`)

# SentencePiece's built-in normalization rules. 'nmt_nfkc' (its default) keeps the case;
# the '_cf' rules also lowercase (Unicode case folding that keeps the German sharp s).
NORMALIZATIONS = ('nmt_nfkc', 'nmt_nfkc_cf', 'nfkc', 'nfkc_cf', 'identity')
MODEL_TYPES = ('bpe', 'unigram', 'word', 'char')  # SentencePiece's algorithms


class Tokenizer:
    """A SentencePiece model with the joint ids and the text it was trained on: a
    `transformer.data.vocabulary.Vocabulary`.

    Text goes in raw and comes out as text: with ``data.pretokenize='moses'`` encoding Moses-
    tokenizes it first and decoding detokenizes and unescapes (transformer/data/pretokenize.py),
    so every caller of `encode` and `decode` follows the run's pretokenization.

    Attributes:
      model_path: the ``.model`` file it was loaded from.
      special: its special ids, `tokens.JOINT`.
      vocab_size: number of ids (pad, eos and unk included).
      fingerprint: a hash of the model file, part of the token-cache keys.
      pretokenize: the text the vocabulary was trained on, one of `PRETOKENIZERS` (a
        vocabulary holding the control piece `MOSES_MARK` was trained on Moses text).
      pretokenizer: the `Pretokenizer` that turns raw text into that text and back.
    """

    special = JOINT

    def __init__(self, model_path: str, key: str | None = None, data_config: Any = None):
        """``key``: the setting that named the file (``'data.vocab_path'``), for the error
        messages; None: a run's own vocabulary. ``data_config``: the ``data`` section whose
        ``pretokenize`` and languages it applies; None: raw text (``'none'``)."""
        self.model_path = os.fspath(model_path)
        where = f'{key}={self.model_path}' if key else self.model_path
        remedy = 'restore the file the run was trained with'
        if key:
            remedy = f'set {key} to a .model file written by SentencePiece'
        with open(self.model_path, 'rb') as f:
            proto = f.read()
        if not proto:  # it would load as a model without pieces
            raise DataError(f'{where} is empty; {remedy}.')
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=proto)
        except RuntimeError as e:
            raise DataError(
                f'{where} is not a SentencePiece model that loads ({e}); {remedy}.'
            ) from None
        self.fingerprint = hashlib.sha256(proto).hexdigest()[:16]
        if (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
            raise DataError(
                f'{where} has pad/eos/unk ids {self._sp.pad_id()}/'
                f'{self._sp.eos_id()}/{self._sp.unk_id()}; this project needs 0/1/2.'
            )
        self.pretokenize = _trained_on(self._sp)
        wanted = data_config.pretokenize if data_config is not None else 'none'
        if wanted != self.pretokenize:
            other = f'give {key} one trained with {wanted!r}' if key else 'use a new --workdir'
            raise DataError(
                f'{where} was trained with data.pretokenize={self.pretokenize!r}, not '
                f'{wanted!r}: set data.pretokenize={self.pretokenize!r} or {other}.'
            )
        languages = (data_config.source_lang, data_config.target_lang) if data_config else ('', '')
        # Lowercasing is the vocabulary's normalization, applied before Moses when it folds.
        folds = self._sp.normalize('A') == self._sp.normalize('a')
        self.pretokenizer = Pretokenizer(self.pretokenize, *languages, lowercase=folds)

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        """Token ids of ``text`` (raw; ``side`` picks the language of its pretokenization),
        without EOS."""
        return self._sp.encode(self.pretokenizer.encode(text, side))

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        """Token ids of many texts of one side (without EOS), encoded on all cores."""
        if self.pretokenize != 'none':
            texts = [self.pretokenizer.encode(text, side) for text in texts]
        return self._sp.encode(texts, num_threads=os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS (padding, 0, skipped), detokenized in the target
        language when the vocabulary was trained on pretokenized text."""
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == self.special.eos:
                break
            if i not in self.special.never_emit:
                out.append(i)
        return self.pretokenizer.decode(self._sp.decode(out))

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)

    def token_id(self, piece: str) -> int | None:
        """The id of the piece ``piece`` (a reserved token), or None when it is no piece."""
        i = self._sp.piece_to_id(piece)
        return None if i == UNK_ID and piece != self._sp.id_to_piece(UNK_ID) else i

    def language_tokens(self) -> list[str]:
        """Target-language tokens (``>>xx<<``): a joint SentencePiece vocabulary has none."""
        return []

    def copy_to(self, directory: str | os.PathLike) -> None:
        """Copies its model into ``directory`` as `FILE` (kept when one is there)."""
        target = os.path.join(directory, FILE)
        if not os.path.exists(target):
            with open(self.model_path, 'rb') as f:
                _write_atomically(target, f.read())


def _trained_on(sp: spm.SentencePieceProcessor) -> str:
    """The pretokenization a vocabulary was trained with: 'moses' when it holds the control
    piece `MOSES_MARK`, else 'none'."""
    i = sp.piece_to_id(MOSES_MARK)
    return 'moses' if i != UNK_ID and sp.is_control(i) else 'none'


def train_tokenizer(
    sentences: Sequence[str],
    model_path: str,
    *,
    vocab_size: int,
    model_type: str = 'bpe',
    normalization: str = 'nmt_nfkc',
    data_config: Any = None,
) -> Tokenizer:
    """Trains a SentencePiece model on ``sentences`` and writes it to ``model_path``.

    Args:
      sentences: training text, one sentence an item (already sampled).
      model_path: where the ``.model`` file goes.
      vocab_size: wanted number of ids; smaller when the text has fewer distinct pieces.
      model_type: 'bpe', 'unigram', 'word' or 'char'.
      normalization: SentencePiece's normalization rule, one of `NORMALIZATIONS`; stored in
        the model, so every later encode applies it too ('nmt_nfkc_cf' lowercases).
      data_config: the ``data`` section the tokenizer applies (`Tokenizer`); with
        ``pretokenize='moses'`` the ``sentences`` are Moses-tokenized already and the
        vocabulary gets the control piece `MOSES_MARK` that records it; with ``data.mix``
        it gets the mix's tags as control pieces (no text produces them). None: raw text.

    Returns:
      The trained tokenizer.
    """
    moses = data_config is not None and data_config.pretokenize == 'moses'
    directory = os.path.dirname(os.path.abspath(model_path))
    os.makedirs(directory, exist_ok=True)
    start = time.perf_counter()
    logging.info(
        'Training a %s SentencePiece vocabulary of %d on %d sentences.',
        model_type,
        vocab_size,
        len(sentences),
    )
    model = _train_model(
        sentences,
        vocab_size=vocab_size,
        model_type=model_type,
        normalization=normalization,
        control_symbols=[MOSES_MARK] * moses + mix_entries.tags(getattr(data_config, 'mix', None)),
    )
    _write_atomically(model_path, model)
    tokenizer = Tokenizer(model_path, data_config=data_config)
    logging.info(
        'Trained the vocabulary (%d ids) in %.1f s: %s.',
        tokenizer.vocab_size,
        time.perf_counter() - start,
        model_path,
    )
    return tokenizer


def _train_model(
    sentences: Sequence[str],
    *,
    vocab_size: int,
    model_type: str,
    normalization: str,
    control_symbols: list[str],
) -> bytes:
    """The serialized SentencePiece model of ``sentences``, with the project's ids."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        # From memory, not a file: the model then holds no paths and the same sentences give a
        # byte-identical model.
        sentence_iterator=(s.replace('\n', ' ').replace('\r', ' ') for s in sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        normalization_rule_name=normalization,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        control_symbols=control_symbols,
        # Tiny corpora (tests, synthetic) have fewer pieces than asked for.
        hard_vocab_limit=False,
        # Sentences were sampled already; SentencePiece's own sampling would re-sample.
        input_sentence_size=0,
        max_sentence_length=1 << 16,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    return model.getvalue()


def _write_atomically(path: str, content: bytes) -> None:
    # A temporary name and a rename: a concurrent reader (another host sharing the workdir)
    # sees the whole file or none.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def sample_indices(num_sources: int, num_targets: int, size: int, seed: int = 0) -> np.ndarray:
    """A seeded, sorted sample of ``size`` indices into sources + targets (all if fewer)."""
    total = num_sources + num_targets
    if size >= total:
        return np.arange(total)
    return np.sort(np.random.default_rng(seed).choice(total, size=size, replace=False))


def sample_sentences(sources: Sequence[str], targets: Sequence[str], size: int, seed: int = 0):
    """A seeded sample of ``size`` sentences from both languages (all of them if fewer)."""
    picked = sample_indices(len(sources), len(targets), size, seed)
    return [sources[i] if i < len(sources) else targets[i - len(sources)] for i in picked]


def _sample(data_config: Any, normalization: str) -> list[str]:
    """``data.vocab_sample_size`` sentences of the training split (both languages) as the new
    vocabulary will read them: pretokenized, lowercased first when ``normalization`` folds.

    Two streaming passes, so that a split larger than memory can be sampled: the first counts
    the pairs, the second keeps the sampled sentences. The sample is `sample_indices`' of the
    whole split, as if it had been read at once: the same sentences in the same order.
    """
    split = data_config.train_split
    count = sum(len(sources) for sources, _ in read_chunks(data_config, split))
    picked = sample_indices(count, count, int(data_config.vocab_sample_size))
    from_sources, from_targets = picked[picked < count], picked[picked >= count] - count
    kept_sources, kept_targets, start = [], [], 0
    for sources, targets in read_chunks(data_config, split):
        end = start + len(sources)
        for wanted, lines, kept in (
            (from_sources, sources, kept_sources),
            (from_targets, targets, kept_targets),
        ):
            chosen = wanted[np.searchsorted(wanted, start) : np.searchsorted(wanted, end)]
            kept += [lines[i - start] for i in chosen.tolist()]
        start = end
    pretokenizer = Pretokenizer(
        data_config.pretokenize,
        data_config.source_lang,
        data_config.target_lang,
        lowercase=normalization.endswith('_cf'),
    )
    return [pretokenizer.encode(s, 'source') for s in kept_sources] + [
        pretokenizer.encode(t, 'target') for t in kept_targets
    ]


def get_tokenizer(data_config: Any, model_path: str | None) -> Tokenizer:
    """The vocabulary of a run: given, reused, or trained and saved at ``model_path``.

    Order: ``data_config.vocab_path`` if set; else ``model_path`` if it exists (a resumed
    run); else a new model trained on a sample of ``vocab_sample_size`` sentences of the
    training split (both languages) and saved at ``model_path`` (in a temporary directory
    when it is None). transformer/rundir.py decides where a run keeps it. A given or reused
    model keeps the normalization it was trained with (``data.vocab_normalization`` only
    applies to a new one); one trained with another ``data.pretokenize`` is refused.

    Args:
      data_config: the ``data`` config section.
      model_path: where the run's ``.model`` file lives, or None.

    Returns:
      The tokenizer.
    """
    if data_config.vocab_path:
        if not os.path.isfile(data_config.vocab_path):
            raise DataError(f'data.vocab_path={data_config.vocab_path} does not exist.')
        return Tokenizer(data_config.vocab_path, key='data.vocab_path', data_config=data_config)
    normalization = data_config.vocab_normalization
    if normalization not in NORMALIZATIONS:
        raise DataError(
            f'data.vocab_normalization must be one of {NORMALIZATIONS}, got {normalization!r}.'
        )
    if model_path is None:
        model_path = os.path.join(tempfile.mkdtemp(prefix='transformer-vocab-'), 'spm.model')
    if os.path.isfile(model_path):
        logging.info('Reusing the vocabulary %s.', model_path)
        tokenizer = Tokenizer(model_path, data_config=data_config)
        if tokenizer.vocab_size > data_config.vocab_size:  # (fewer can be the text's limit)
            raise DataError(
                f'The vocabulary {model_path} has {tokenizer.vocab_size} pieces, more than '
                f'data.vocab_size={data_config.vocab_size}: it was trained with another '
                "data.vocab_size. Resume with the run's own, or use a new --workdir."
            )
        return tokenizer
    return train_tokenizer(
        _sample(data_config, normalization),
        model_path,
        vocab_size=int(data_config.vocab_size),
        model_type=data_config.vocab_model_type,
        normalization=normalization,
        data_config=data_config,
    )
