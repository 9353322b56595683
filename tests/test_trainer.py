"""The training loop: exact resume, clear errors, the train.py command, non-finite stops."""

import jax
import numpy as np
import pytest

from tests.tiny_run import tiny_run_config
from transformer import trainer, workdir


def _params_at(run_dir, step):
    _, _, _, params, _ = workdir.load_model(str(run_dir), step=step)
    return params


def test_resume_continues_exactly(tmp_path):
    """3 steps, stop, restart to 6 == 6 uninterrupted steps: same losses (so the same batches
    and dropout masks) and the same final parameters."""
    straight, first, resumed = {}, {}, {}
    trainer.train_and_evaluate(
        tiny_run_config(6), str(tmp_path / 'a'), on_step=lambda s, m: straight.update({s: m})
    )
    trainer.train_and_evaluate(
        tiny_run_config(3), str(tmp_path / 'b'), on_step=lambda s, m: first.update({s: m})
    )
    final = trainer.train_and_evaluate(
        tiny_run_config(6), str(tmp_path / 'b'), on_step=lambda s, m: resumed.update({s: m})
    )
    assert sorted(first) == [1, 2, 3] and sorted(resumed) == [4, 5, 6]
    assert final['steps_this_run'] == 3
    for step in range(1, 7):
        got = (first | resumed)[step]['loss']
        np.testing.assert_allclose(got, straight[step]['loss'], rtol=1e-6, err_msg=f'step {step}')
    a, b = _params_at(tmp_path / 'a', 6), _params_at(tmp_path / 'b', 6)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_resume_with_another_model_is_a_clear_error_and_keeps_the_run(tmp_path):
    """Restarting a workdir with a changed model fails with one line and leaves the saved
    config and checkpoints as they were."""
    trainer.train_and_evaluate(tiny_run_config(3), str(tmp_path))
    saved_config = (tmp_path / 'config.json').read_text()
    changed = tiny_run_config(6)
    changed.model.d_ff = 48
    with pytest.raises(workdir.WorkdirError, match='does not fit this config') as info:
        trainer.train_and_evaluate(changed, str(tmp_path))
    assert '\n' not in str(info.value)
    assert (tmp_path / 'config.json').read_text() == saved_config
    assert np.isfinite(jax.tree.leaves(_params_at(tmp_path, 3))[0]).all()


def test_train_py_smoke(tmp_path, monkeypatch):
    """`python train.py --config configs/tiny.py` end to end for a few steps, in-process:
    it writes the config, vocabulary, metrics (JSONL + TensorBoard, validation loss and BLEU)
    and checkpoints."""
    import json
    import sys

    workdir = tmp_path / 'run'
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}']
    overrides = {
        'model.d_model': 32,
        'model.d_ff': 64,
        'model.num_encoder_layers': 1,
        'model.num_decoder_layers': 1,
        'model.max_len': 32,
        'data.max_len': 32,
        'data.synthetic.num_train': 200,
        'data.synthetic.num_validation': 20,
        'data.synthetic.num_test': 20,
        'data.vocab_size': 300,
        'train.batch_size': 8,
        'train.num_steps': 4,
        'train.log_every': 2,
        'train.checkpoint_every': 2,
        'eval.batch_size': 16,
        'eval.bleu_every': 4,
        'eval.bleu_max_examples': 5,
        'eval.beam_size': 2,
    }
    argv += [f'--config.{k}={v}' for k, v in overrides.items()]
    # ml_collections registers the --config.x.y override flags from sys.argv.
    monkeypatch.setattr(sys, 'argv', argv)
    with pytest.raises(SystemExit) as exit_info:
        trainer.cli(argv)
    assert not exit_info.value.code, exit_info.value.code
    records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
    train_steps = [r['step'] for r in records if r['split'] == 'train']
    assert train_steps == [2, 4]
    assert all(0.0 <= r['data_wait'] <= 1.0 for r in records if r['split'] == 'train')
    assert any(r['split'] == 'validation' and r['step'] == 4 and 'loss' in r for r in records)
    bleu = [r for r in records if 'sacrebleu' in r]  # validation BLEU through evaluate's code
    assert [r['step'] for r in bleu] == [4] and 0.0 <= bleu[0]['sacrebleu'] <= 100.0
    assert all(np.isfinite(r['loss']) for r in records if 'loss' in r)
    assert json.loads((workdir / 'config.json').read_text())['train']['num_steps'] == 4
    assert (workdir / 'vocab' / 'spm.model').exists()
    assert sorted(p.name for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()) == [
        '2',
        '4',
    ]
    assert list((workdir / 'tensorboard').iterdir())


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    """A learning rate that blows up stops the run with a clear error; the checkpoint saved
    before the blow-up is still there and loads."""
    config = tiny_run_config(30)
    config.opt.schedule = 'constant'
    config.opt.lr_scale = 1e12
    config.train.checkpoint_every = 1
    config.train.log_every = 1
    with pytest.raises(trainer.TrainingError, match='Non-finite'):
        trainer.train_and_evaluate(config, str(tmp_path))
    steps = workdir.checkpoint_steps(str(tmp_path), average_last=100)
    assert steps, 'a good checkpoint must survive'
    params = _params_at(tmp_path, steps[-1])
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
