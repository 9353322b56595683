"""Scoring translations: BLEU conventions (bleu.py) and decoding + scoring an evaluation set
(score.py), shared by the evaluate command and validation during training."""
