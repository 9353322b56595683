"""Validation during training: an evaluation split it cannot use stops the run at once."""

import pytest

from tests.tiny_run import tiny_run_config
from transformer import data
from transformer.commands import train as trainer


def test_an_empty_validation_split_is_one_line_before_any_step(tmp_path):
    """With no validation examples the run used to train to the end, then fail in the final
    validation with a KeyError (and lose the checkpoint being written). A synthetic task
    asked for none is refused when its config is parsed; a folder whose validation files are
    empty, when they are read, before the first step."""
    config = tiny_run_config(4)
    config.data.synthetic.num_validation = 0
    with pytest.raises(ValueError, match='data.synthetic.num_validation=0 must be >= 1'):
        trainer.train_and_evaluate(config, str(tmp_path / 'synthetic'))
    folder = tmp_path / 'text'
    folder.mkdir()
    sources, targets = data.load_text(tiny_run_config(4).data, 'train')
    for lang, lines in (('en', sources), ('de', targets)):
        (folder / f'train.{lang}').write_text(''.join(line + '\n' for line in lines))
        (folder / f'validation.{lang}').write_text('')
    config = tiny_run_config(4)
    config.data.dataset, config.data.folder = 'folder', str(folder)
    steps_taken = []
    with pytest.raises(data.DataError) as info:
        trainer.train_and_evaluate(
            config, str(tmp_path), on_step=lambda step, metrics: steps_taken.append(step)
        )
    assert str(info.value) == (
        "The 'validation' split (data.eval_split) of folder has no examples; validation needs some."
    )
    assert steps_taken == []
