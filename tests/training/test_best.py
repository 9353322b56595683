"""The best checkpoint by validation BLEU and early stopping: kept beside the last K
checkpoints, loaded by `evaluate --best`, and resume-safe."""

import jax
import numpy as np
import pytest

from tests.tiny_run import tiny_run_config
from transformer import evaluate
from transformer.checkpoint import checkpoint_steps, load_model
from transformer.schema import METRICS
from transformer.training import validation
from transformer.training.best import BestTracker


def test_tracker_counts_evaluations_without_improvement():
    config = tiny_run_config(1)
    config.train.early_stop_patience = 2
    tracker = BestTracker.from_config(config)
    improved = [tracker.update(s, {'sacrebleu': v}) for s, v in ((1, 5), (2, 7), (3, 7), (4, 6))]
    assert improved == [True, True, False, False] and tracker.should_stop
    again = BestTracker.from_config(config, {'best': tracker.state()})
    assert (again.step, again.score, again.evals_since_best) == (2, 7.0, 2)
    config.train.early_stop_patience = 0
    assert not BestTracker.from_config(config, {'best': tracker.state()}).should_stop


def _train(tmp_path, monkeypatch, num_steps, scores):
    """Trains with validation BLEU at every step, the BLEU values scripted."""
    config = tiny_run_config(num_steps)
    config.train.checkpoint_every = 1
    config.train.keep_checkpoints = 2
    config.train.early_stop_patience = 2
    config.eval.average_last = 1
    config.eval.bleu_every = 1
    values = iter(scores)
    monkeypatch.setattr(
        validation.Validation,
        'bleu',
        lambda self, params: dict.fromkeys(METRICS, next(values)),
    )
    from transformer.commands import train as trainer

    return trainer.train_and_evaluate(config, str(tmp_path))


@pytest.mark.slow
def test_best_checkpoint_survives_keep_and_early_stop_survives_restarts(tmp_path, monkeypatch):
    # Steps 1-3: BLEU 5, 7 (best), 6: one evaluation without improvement so far.
    first = _train(tmp_path, monkeypatch, 3, [5.0, 7.0, 6.0])
    assert first['best'] == {'step': 2, 'score': 7.0, 'evals_since_best': 1}
    _, _, _, at_2, steps = load_model(str(tmp_path), best=True)
    assert steps == [2]
    # The restart continues the count: one more evaluation without improvement stops it.
    second = _train(tmp_path, monkeypatch, 10, [6.5])
    assert second['stopped_early'] and second['step'] == 4 and second['steps_this_run'] == 1
    assert checkpoint_steps(str(tmp_path), average_last=10) == [3, 4]
    _, _, _, best, steps = load_model(str(tmp_path), best=True)
    assert steps == [2]  # step 2 left checkpoints/ (keep 2) but stays in best/
    for x, y in zip(jax.tree.leaves(best), jax.tree.leaves(at_2), strict=True):
        np.testing.assert_array_equal(x, y)
    # A run that stopped early stays stopped.
    third = _train(tmp_path, monkeypatch, 10, [])
    assert third['steps_this_run'] == 0 and third['stopped_early']

    out = tmp_path / 'best.txt'
    argv = ['evaluate', f'--workdir={tmp_path}', '--best', '--max_examples=3', f'--output={out}']
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli([*argv, '--beam_size=1'])  # greedy: what is asserted is what --best loads
    assert not exit_info.value.code
    assert len(out.read_text().splitlines()) == 3
