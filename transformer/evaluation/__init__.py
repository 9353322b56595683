"""Scoring translations, shared by the evaluate command and validation during training.

Modules: bleu.py (the BLEU conventions: sacreBLEU, tokenized BLEU as the paper computed it,
chrF, chrF++), score.py (decode an evaluation set and score it against its raw references).
"""

from transformer.evaluation.bleu import bleu_scores
from transformer.evaluation.score import score_eval_set

__all__ = ['bleu_scores', 'score_eval_set']
