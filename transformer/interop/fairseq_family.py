"""fairseq's translation families as entries of the registry (families.py): 'm2m100' (M2M100
and NLLB-200's dense models, ``model_type`` 'm2m_100') and 'mbart' (mBART-50, ``model_type``
'mbart'). Each entry joins the model side (fairseq.py reads it, fairseq_export.py writes it)
to its vocabulary (fairseq_vocab.py: NLLB-200's or M2M100's for 'm2m100', mBART-50's for
'mbart'), so convert, ``train.init_from``, the run directory and ``export --format hf`` take
them as they take a MarianMT.

`load` reads both and checks that they agree: the vocabulary has at most the model's rows
(config.json's ``vocab_size``; the rows past the tokenizer's ids are kept, fairseq_vocab.py),
its family is the model's, and its special ids are the model's (fairseq_config.FAIRSEQ_IDS,
with the ids ``bad_words_ids`` bans never emitted). `write_hf` writes the model's files and
the vocabulary's (tokenizer files with the added tokens registered).
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformer.data import DataError
from transformer.formats import ExportError
from transformer.interop import fairseq, fairseq_export, fairseq_vocab
from transformer.interop.fairseq_config import SPECS
from transformer.interop.fairseq_params import FairseqError, params_from_state_dict
from transformer.interop.fairseq_vocab import FairseqVocabulary
from transformer.interop.family import Family, Pretrained
from transformer.interop.generation import CONFIG_FILE
from transformer.interop.state_dict import read_state_dict
from transformer.model import export_refusal

# The vocabulary kinds (fairseq_vocab.py) of each family's directories.
KINDS = {'m2m100': ('nllb', 'm2m100'), 'mbart': ('mbart50',)}
# The kind a family's vocabulary is read as where tokenizer_config.json names no class (None:
# M2M100's vocab.json tells it from NLLB-200's files).
DEFAULT_KIND = {'m2m100': None, 'mbart': 'mbart50'}
TITLES = {'m2m100': 'M2M100/NLLB-200', 'mbart': 'mBART-50'}  # in messages


def _model_type(family: str) -> str:
    return next(t for t, spec in SPECS.items() if spec.name == family)


def _vocabulary(read: fairseq.FairseqModel) -> FairseqVocabulary:
    """The vocabulary of the directory ``read`` came from, checked against its model."""
    directory = read.directory
    kind = DEFAULT_KIND[read.family]
    if fairseq_vocab.held_kind(directory) is None and kind is None:
        kind = 'm2m100' if os.path.isfile(os.path.join(directory, 'vocab.json')) else 'nllb'
    banned = read.special.never_emit[len(fairseq_vocab.FAIRSEQ.never_emit) :]
    try:
        vocab = FairseqVocabulary(directory, never_emit=banned, rows=read.vocab_size, kind=kind)
    except DataError as e:
        raise FairseqError(str(e)) from None
    if vocab.kind not in KINDS[read.family]:
        raise FairseqError(
            f'{os.path.join(directory, CONFIG_FILE)}: model_type={_model_type(read.family)!r} '
            f'but the tokenizer files are an {vocab.title} vocabulary: restore the files the '
            'model came with.'
        )
    if vocab.special != read.special:  # one place declares them (fairseq_config.py)
        raise FairseqError(
            f'{directory}: the vocabulary has special ids {vocab.special}, the model '
            f'{read.special}; this is a bug of the converter, please report it.'
        )
    return vocab


def load(directory: str, weights: bool = True) -> Pretrained:
    """Reads an M2M100/NLLB-200 or mBART-50 directory: the model (fairseq.py) and its
    vocabulary (`_vocabulary`); ``languages`` are tokenizer_config.json's ``src_lang`` and
    ``tgt_lang`` where it names them. One-line `FairseqError`s, before anything is written."""
    read = fairseq.read(os.fspath(directory), weights=False)
    vocab = _vocabulary(read)  # checked before the weights are read
    if weights:
        state = read_state_dict(read.directory, TITLES[read.family], FairseqError)
        read.params = params_from_state_dict(state, read.config(), read.directory)
    languages = (vocab.config.get('src_lang'), vocab.config.get('tgt_lang'))
    languages = tuple(x if isinstance(x, str) else None for x in languages)
    return Pretrained(
        read.family,
        read.directory,
        read.model,
        read.eval,
        read.generation,
        languages,
        vocab,
        read.params,
        read.files,
    )


def writer(family: str):
    """`Family.write` of ``family``: (directory, cfg, run_config, tokenizer, params, source,
    length_exponent) -> None, writing model.safetensors, config.json, generation_config.json
    (a converted run's own files come back, fairseq_export.py) and the vocabulary's files (its
    added tokens registered). A run whose vocabulary is not this family's is refused in one
    line before anything is written."""

    def write_hf(
        directory: str,
        cfg: Any,
        run_config: Any,
        tokenizer: Any,
        params: Any,
        source: dict[str, Any] | None = None,
        *,
        length_exponent: float,
    ) -> None:
        refusal = export_refusal(cfg, fairseq_export.WRITES[family])  # the model first
        if refusal:
            raise ExportError(refusal)
        if not (isinstance(tokenizer, FairseqVocabulary) and tokenizer.kind in KINDS[family]):
            raise ExportError(
                f'The run holds no {TITLES[family]} vocabulary (its tokenizer files in vocab/): '
                'the export writes the one the model was converted with.'
            )
        ev = run_config.eval
        generation = None
        if not source:
            forced = ev.eos_at_limit == 'forced'
            generation = fairseq_export.generation_config(ev.beam_size, length_exponent, forced)
        fairseq_export.write_model(directory, cfg, family, params, source, generation)
        fairseq_vocab.write_vocabulary(tokenizer, [], directory)

    return write_hf


def recognises(family: str):
    """(directory) -> whether it is ``family``'s model directory: config.json's model_type
    is the family's, and no run directory's checkpoints are beside it; never raises."""
    model_type = _model_type(family)

    def recognised(directory: str) -> bool:
        if not fairseq.recognises(directory):
            return False
        try:
            with open(os.path.join(directory, CONFIG_FILE), encoding='utf-8') as f:
                return json.load(f).get('model_type') == model_type
        except (OSError, ValueError, AttributeError):
            return False

    return recognised


def _entry(family: str) -> Family:
    kinds = KINDS[family]
    return Family(
        name=family,
        title=TITLES[family],
        model_types=(_model_type(family),),
        recognises=recognises(family),
        load=load,
        owns_vocabulary=lambda v: isinstance(v, FairseqVocabulary) and v.kind in kinds,
        holds_vocabulary=lambda d: fairseq_vocab.held_kind(d) in kinds,
        load_vocabulary=fairseq_vocab.load_vocabulary,
        write_vocabulary=fairseq_vocab.write_vocabulary,
        tokenizer_files=fairseq_vocab.tokenizer_files,
        writes=fairseq_export.WRITES[family],
        write=writer(family),
    )


M2M100 = _entry('m2m100')
MBART = _entry('mbart')
