"""Validation during training: an evaluation split it cannot use stops the run at once."""

import pytest

from tests.tiny_run import tiny_run_config
from transformer import data, trainer


def test_an_empty_validation_split_is_one_line_before_any_step(tmp_path):
    """With no validation examples the run used to train to the end, then fail in the final
    validation with a KeyError (and lose the checkpoint being written)."""
    config = tiny_run_config(4)
    config.data.synthetic.num_validation = 0
    steps_taken = []
    with pytest.raises(data.DataError) as info:
        trainer.train_and_evaluate(
            config, str(tmp_path), on_step=lambda step, metrics: steps_taken.append(step)
        )
    assert str(info.value) == (
        "The 'validation' split (data.eval_split) of synthetic has no examples; validation "
        'needs some (for the synthetic task: data.synthetic.num_validation >= 1).'
    )
    assert steps_taken == []
