"""The run directory: checkpoint loading and averaging, and its one-line errors."""

import json
import shutil

import jax
import numpy as np
import pytest

from transformer import workdir


def test_average_of_two_checkpoints_is_their_mean(run_dir):
    """--average_last 2 loads the element-wise mean of the step-2 and step-4 parameters."""
    _, _, _, averaged, steps = workdir.load_model(str(run_dir), average_last=2)
    assert steps == [2, 4]
    _, _, _, p2, _ = workdir.load_model(str(run_dir), step=2)
    _, _, _, p4, _ = workdir.load_model(str(run_dir), step=4)
    changed = 0
    for a, x, y in zip(*(jax.tree.leaves(t) for t in (averaged, p2, p4)), strict=True):
        np.testing.assert_allclose(a, (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6)
        changed += int(not np.allclose(x, y))
    assert changed > 0  # the two checkpoints differ, so the mean is not trivially either


def test_missing_workdir_checkpoint_and_vocab_are_one_line_errors(run_dir, tmp_path):
    """No config, no checkpoints, an unknown step, no vocabulary: a WorkdirError whose
    single line names what is missing, not a traceback from inside Orbax."""
    with pytest.raises(workdir.WorkdirError, match='config.json not found'):
        workdir.load_model(str(tmp_path / 'nowhere'))
    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    with pytest.raises(workdir.WorkdirError, match=r'No checkpoint for step 3.*\[2, 4\]'):
        workdir.load_model(str(broken), step=3)
    shutil.rmtree(broken / 'vocab')
    with pytest.raises(workdir.WorkdirError, match='No vocabulary'):
        workdir.load_model(str(broken))
    shutil.copytree(run_dir / 'vocab', broken / 'vocab')
    shutil.rmtree(broken / 'checkpoints')
    with pytest.raises(workdir.WorkdirError, match='No checkpoints'):
        workdir.load_model(str(broken))


def test_checkpoint_of_another_model_shape_is_a_clear_error(run_dir, tmp_path):
    """A config.json whose model differs from the saved parameters fails with one line."""
    other = tmp_path / 'other'
    shutil.copytree(run_dir, other)
    config = json.loads((other / 'config.json').read_text())
    config['model']['d_ff'] = 48
    (other / 'config.json').write_text(json.dumps(config))
    with pytest.raises(workdir.WorkdirError, match='does not fit the model') as info:
        workdir.load_model(str(other))
    assert '\n' not in str(info.value)


def test_partial_checkpoint_is_a_clear_error(run_dir, tmp_path):
    """A checkpoint whose parameter files are gone (a copy cut short) fails with one line."""
    partial = tmp_path / 'partial'
    shutil.copytree(run_dir, partial)
    for path in (partial / 'checkpoints' / '4' / 'params').iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name != '_METADATA':
            path.unlink()
    with pytest.raises(workdir.WorkdirError) as info:
        workdir.load_model(str(partial), step=4)
    assert '\n' not in str(info.value)
