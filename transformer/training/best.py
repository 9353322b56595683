"""The best checkpoint by validation BLEU, and early stopping on it.

Every validation BLEU (``eval.bleu_every``) is compared with the best so far
(``eval.best_metric``, higher is better); an improvement replaces ``WORKDIR/best`` with the
current parameters (transformer/checkpoint/run.py), and ``train.early_stop_patience``
evaluations in a row without one (0 = never) stop the run. The tracker's state travels in
every regular checkpoint's meta, so a restarted run keeps the best score and the patience
count, and a run that stopped early stays stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass
class BestTracker:
    """The best validation score so far, where it was reached and the evaluations since."""

    metric: str = 'sacrebleu'
    patience: int = 0  # evaluations without improvement that stop the run; 0 = never
    step: int | None = None  # the step of the best score (None: no evaluation yet)
    score: float | None = None
    evals_since_best: int = 0

    @classmethod
    def from_config(cls, config: Any, meta: Mapping[str, Any] | None = None) -> BestTracker:
        """A tracker for ``config``, continuing the state saved in a checkpoint's ``meta``."""
        saved = dict((meta or {}).get('best') or {})
        return cls(
            metric=config.eval.best_metric,
            patience=int(config.train.early_stop_patience),
            step=saved.get('step'),
            score=saved.get('score'),
            evals_since_best=int(saved.get('evals_since_best', 0)),
        )

    def update(self, step: int, scores: Mapping[str, float]) -> bool:
        """Records one validation evaluation; returns whether it is the best so far."""
        score = float(scores[self.metric])
        if self.score is None or score > self.score:
            self.step, self.score, self.evals_since_best = step, score, 0
            return True
        self.evals_since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.evals_since_best >= self.patience

    def state(self) -> dict[str, Any]:
        """What a checkpoint's meta keeps (JSON)."""
        return {'step': self.step, 'score': self.score, 'evals_since_best': self.evals_since_best}
