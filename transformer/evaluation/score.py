"""Decode an evaluation set and score it against its raw references.

Sentences are decoded by transformer/decoding/translation.py's batch path and scored by
transformer/evaluation/bleu.py: sacreBLEU (cased, detokenized), tokenized BLEU as the paper
computed it, chrF and chrF++. The evaluate command and the trainer's validation BLEU both run
through `score_eval_set`, so both report the same number for the same parameters.
"""

from __future__ import annotations

from typing import Any

from transformer import data as data_lib
from transformer import decoding, schema
from transformer.evaluation import bleu
from transformer.model import Transformer

PyTree = Any


def score_eval_set(
    config: schema.Experiment,
    tokenizer: data_lib.Tokenizer,
    model: Transformer,
    params: PyTree,
    eval_set: data_lib.EvalSet,
    *,
    beam_size: int,
    options: decoding.DecodeOptions | None = None,
    layout: decoding.DecodeLayout | None = None,
    sampling: decoding.Sampling | None = None,
    constraints: decoding.Constraints | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Decodes ``eval_set`` and scores it (with the run's BLEU conventions); ``params`` may
    be an `Ensemble` (`ensemble.load_ensemble`); ``options`` default to the run's
    (`decoding.decode_options` of its ``eval`` section). With a ``layout`` the sentences are
    split over its mesh and processes (`decoding.decode`); every process gets every
    hypothesis, so every process computes the same scores. With ``sampling``, each
    sentence's sample is seeded by its index in the split; ``constraints`` apply to either.

    Returns:
      (scores, hypotheses in the split's order).
    """
    hypotheses = decoding.translate_batches(
        model,
        params,
        tokenizer,
        eval_set.batches,
        beam_size=beam_size,
        options=options or decoding.decode_options(config.eval),
        layout=layout,
        sampling=sampling,
        constraints=constraints,
    )
    scores = bleu.bleu_scores(
        hypotheses,
        eval_set.references,
        target_lang=config.data.target_lang,
        lowercase_tokenized=bool(config.eval.lowercase_tokenized),
        compound_split=bool(config.eval.compound_split),
    )
    return scores, hypotheses
