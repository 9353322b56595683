"""The training loop: exact resume, clear errors, the train.py command, non-finite stops."""

import json
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.subprocess_env import memory_capped, repo_env, xla_flags
from tests.tiny_run import SMALL, command_line, tiny_run_config
from transformer import rundir
from transformer.checkpoint import checkpoint_steps, load_model, read_meta, verify_step
from transformer.commands import train as trainer

REPO = pathlib.Path(__file__).parents[2]


def _one_cpu():
    """One CPU device, for a run whose checks do not depend on the number of devices: its
    programs are compiled by XLA's older code generators, faster (tests/compiles.py)."""
    return jax.devices('cpu')[:1]


def _one_cpu_env():
    """The environment of a train.py started for such a run: one CPU device, compiled as
    `_one_cpu`'s programs are (tests/subprocess_env.py)."""
    return repo_env(JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(1))


def _params_at(run_dir, step):
    _, _, _, params, _ = load_model(str(run_dir), step=step)
    return params


@pytest.mark.slow
def test_resume_continues_exactly(run_dir, tmp_path):
    """Conftest's 4-step run, copied with its step 4 removed, restarted at step 2 == its 4
    uninterrupted steps: the same losses at steps 3 and 4 (so the same batches and dropout
    masks) and the same final parameters."""
    import shutil

    config = tiny_run_config(4)
    config.train.checkpoint_every = 2  # the command that trained conftest's run
    straight = {
        r['step']: r
        for r in map(json.loads, (run_dir / 'metrics.jsonl').open())
        if r['split'] == 'train'
    }
    assert sorted(straight) == [1, 2, 3, 4]
    shutil.copytree(run_dir, tmp_path / 'b')
    shutil.rmtree(tmp_path / 'b' / rundir.CHECKPOINTS / '4')
    resumed = {}
    final = trainer.train_and_evaluate(
        config, str(tmp_path / 'b'), on_step=lambda s, m: resumed.update({s: m})
    )
    assert sorted(resumed) == [3, 4] and final['steps_this_run'] == 2
    for step in (3, 4):
        got = resumed[step]['loss']
        np.testing.assert_allclose(got, straight[step]['loss'], rtol=1e-6, err_msg=f'step {step}')
    a, b = _params_at(run_dir, 4), _params_at(tmp_path / 'b', 4)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_resume_with_another_model_is_a_clear_error_and_keeps_the_run(run_dir, tmp_path):
    """Restarting a workdir (a copy of conftest's 4-step run) with a changed model fails with
    one line naming the setting, before anything is written, and leaves the saved config and
    checkpoints as they were. With a config.json of the changed model, the checkpoint's own
    shapes name the parameter that does not fit."""
    import shutil

    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    saved_config = (run / 'config.json').read_text()
    assert not (run / rundir.HISTORY_FILE).exists()
    changed = tiny_run_config(6)
    changed.model.d_ff = 48
    with pytest.raises(rundir.WorkdirError, match='trained with model.d_ff=64, not 48') as info:
        trainer.train_and_evaluate(changed, str(run))
    assert '\n' not in str(info.value)
    assert (run / 'config.json').read_text() == saved_config
    assert not (run / rundir.HISTORY_FILE).exists()
    rundir.write_config(str(run), changed)  # (without config.json a resume stops)
    with pytest.raises(rundir.WorkdirError, match='does not fit this config') as info:
        trainer.train_and_evaluate(changed, str(run))
    # Named from the checkpoint's metadata, before any array is read.
    assert "params['decoder_layer_0']['ffn']['wi']['bias'] is (64,) there, (48,) here" in (
        str(info.value)
    )
    (run / 'config.json').write_text(saved_config)
    assert np.isfinite(jax.tree.leaves(_params_at(run, 4))[0]).all()


@pytest.mark.slow
def test_resume_with_other_settings_keeps_the_record(run_dir, tmp_path, caplog):
    """config.json stays what the run started with; a resume that changes training settings
    applies them, says so in one line each and appends them to config_history.jsonl, which
    the commands read back; resuming again with the same settings records nothing new; the
    path to the same data files may change freely. A run started with the default dropout_prng
    'threefry' (a copy of conftest's 4-step run) and resumed with 'rbg' draws other masks from
    then on: one warning line naming both and the flag that keeps the saved one, and none on
    the next resume. The last resume reads a config.json as 2698791-9f56641 wrote it, with
    settings since removed (train.loss_pass 'float32', dropped; model.attention_impl
    'cudnn_packed', loaded as 'auto' with a warning, no change recorded)."""
    import shutil

    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    started = (run / 'config.json').read_text()
    changed = tiny_run_config(5)
    changed.train.checkpoint_every = 2  # as conftest's run: not a change
    changed.train.dropout_prng = 'rbg'
    changed.opt.warmup_steps = 100
    changed.eval.beam_size = 2
    changed.data.cache_dir = str(tmp_path / 'cache')
    with caplog.at_level('INFO'):
        final = trainer.train_and_evaluate(changed, str(run), devices=_one_cpu())
    assert final['steps_this_run'] == 1
    assert (run / 'config.json').read_text() == started
    warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    prng = [w for w in warnings if 'dropout_prng' in w]
    assert len(prng) == 1 and '\n' not in prng[0]
    assert "'threefry'" in prng[0] and '--config.train.dropout_prng=threefry' in prng[0]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Resuming at')]
    assert lines == [
        f"Resuming at step 4 with data.cache_dir='{tmp_path}/cache' (was None).",
        'Resuming at step 4 with eval.beam_size=2 (was 4).',
        'Resuming at step 4 with opt.warmup_steps=100 (was 200).',
        "Resuming at step 4 with train.dropout_prng='rbg' (was 'threefry').",
        'Resuming at step 4 with train.num_steps=5 (was 4).',
    ]
    history = rundir.read_history(str(run))
    assert history == [
        {'step': 4, 'key': 'data.cache_dir', 'old': None, 'new': str(tmp_path / 'cache')},
        {'step': 4, 'key': 'eval.beam_size', 'old': 4, 'new': 2},
        {'step': 4, 'key': 'opt.warmup_steps', 'old': 200, 'new': 100},
        {'step': 4, 'key': 'train.dropout_prng', 'old': 'threefry', 'new': 'rbg'},
        {'step': 4, 'key': 'train.num_steps', 'old': 4, 'new': 5},
    ]
    effective = rundir.read_config(str(run))
    assert (effective.opt.warmup_steps, effective.eval.beam_size) == (100, 2)
    saved = json.loads(started)
    saved['train']['loss_pass'] = 'float32'
    saved['model']['attention_impl'] = 'cudnn_packed'
    (run / 'config.json').write_text(json.dumps(saved))
    changed.train.num_steps = 6
    caplog.clear()
    with caplog.at_level('WARNING'):
        trainer.train_and_evaluate(changed, str(run), devices=_one_cpu())
    assert rundir.read_history(str(run))[5:] == [
        {'step': 5, 'key': 'train.num_steps', 'old': 5, 'new': 6}
    ]
    assert any("'cudnn_packed' was removed" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if 'dropout_prng' in r.getMessage()]
    assert checkpoint_steps(str(run)) == [6]  # the removed settings' run trained on


def test_train_py_smoke(tmp_path, monkeypatch):
    """`python train.py --config configs/tiny.py` end to end for a few steps, in-process:
    it writes the config, vocabulary, metrics (JSONL + TensorBoard, validation loss and BLEU)
    and checkpoints."""
    import json
    import sys

    workdir = tmp_path / 'run'
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}']
    argv += command_line(
        {
            **SMALL,
            # As conftest's run (`tiny_run_config`): its training step, compiled by then and
            # read from the compilation cache.
            'model.dropout_rate': 0.1,
            'train.num_steps': 4,
            'train.log_every': 2,
            'train.checkpoint_every': 2,
            'eval.bleu_every': 4,
            'eval.bleu_max_examples': 5,
            # Greedy: the BLEU is evaluate's code whatever the search, and greedy compiles in
            # a fraction of beam search's time (validation BLEU by beam search:
            # tests/test_console.py).
            'eval.beam_size': 1,
        }
    )
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
    assert 0.0 <= bleu[0]['chrf++'] <= 100.0  # every validation score of evaluate's
    assert all(np.isfinite(r['loss']) for r in records if 'loss' in r)
    assert json.loads((workdir / 'config.json').read_text())['train']['num_steps'] == 4
    assert (workdir / 'vocab' / 'spm.model').exists()
    assert sorted(p.name for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()) == [
        '2',
        '4',
    ]
    assert list((workdir / 'tensorboard').iterdir())


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    """A learning rate that blows up stops the run with a clear error; the checkpoint saved
    before the blow-up is still there and loads."""
    config = tiny_run_config(30)
    config.opt.schedule = 'constant'
    config.opt.lr_scale = 1e12
    config.train.checkpoint_every = 1
    config.train.log_every = 1
    with pytest.raises(trainer.TrainingError, match='Non-finite') as info:
        trainer.train_and_evaluate(config, str(tmp_path), devices=_one_cpu())
    assert 'Newest verified checkpoint: step' in str(info.value)
    assert 'may be bad' not in str(info.value)  # a fresh run: the learning rate is the suspect
    steps = checkpoint_steps(str(tmp_path), average_last=100)
    assert steps, 'a good checkpoint must survive'
    params = _params_at(tmp_path, steps[-1])
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_non_finite_right_after_resume_suspects_the_checkpoint(run_dir, tmp_path):
    """A loss that turns non-finite within train.log_every steps of a resume: the message
    names the newest verified checkpoint and says the checkpoint itself may be bad."""
    import shutil

    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    config = tiny_run_config(12)
    config.opt.schedule = 'constant'
    config.opt.lr_scale = 1e12
    config.train.checkpoint_every = 2
    config.train.log_every = 8
    with pytest.raises(trainer.TrainingError) as info:
        # One device, as the test above: the same step program, compiled once.
        trainer.train_and_evaluate(config, str(run), devices=_one_cpu())
    message = str(info.value)
    assert 'Newest verified checkpoint: step' in message and '\n' not in message
    assert 'resumed from step 4' in message and 'checkpoint itself may be bad' in message


# The kill test's run: configs/tiny.py shrunk to seconds, a checkpoint every step, async.
_KILL_OVERRIDES = {
    **SMALL,
    'data.synthetic.num_validation': 8,
    'data.synthetic.num_test': 8,
    'train.num_steps': 10,
    'train.log_every': 1,
    'train.eval_every': 0,
    'train.checkpoint_every': 1,
    'train.async_checkpointing': True,
    'eval.bleu_every': 0,
    'eval.batch_size': 8,
}


def _meta(run_dir, step):
    return read_meta(str(run_dir), step)


def _train_lines(run_dir):
    metrics = run_dir / 'metrics.jsonl'
    return metrics.read_text().count('"split": "train"') if metrics.exists() else 0


def _wait_for(condition, proc, timeout=180.0):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not condition():
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_anywhere_then_rerun_equals_an_uninterrupted_run(tmp_path):
    """`python train.py` SIGKILLed twice (at a random moment after it trained a step, then
    while an asynchronous checkpoint is being written), re-run each time with the same
    command: no partial step is ever on disk as a step or restored, and the final parameters
    and data position equal those of an uninterrupted run exactly."""
    # Saved once, at the last step, the one compared: saves do not change what is trained.
    # Trained by train.py itself, as the killed runs: the same compiler settings (the same
    # program on one device of this process may round differently).
    saved_once = {**_KILL_OVERRIDES, 'train.checkpoint_every': _KILL_OVERRIDES['train.num_steps']}
    straight = [sys.executable, 'train.py', '--config=configs/tiny.py']
    straight += [f'--workdir={tmp_path / "straight"}', *command_line(saved_once)]
    subprocess.run(straight, cwd=REPO, env=_one_cpu_env(), capture_output=True, check=True)
    killed = tmp_path / 'killed'
    ckpts = killed / 'checkpoints'
    command = [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={killed}']
    command += command_line(_KILL_OVERRIDES)
    rng, steps_seen = random.Random(0), []
    tmp_dir = lambda: any('tmp' in p.name for p in ckpts.iterdir()) if ckpts.exists() else False
    for attempt in range(3):
        log = tmp_path / f'attempt{attempt}.log'
        before = _train_lines(killed)
        with open(log, 'w') as err:
            proc = subprocess.Popen(
                command, cwd=REPO, env=_one_cpu_env(), stdout=subprocess.DEVNULL, stderr=err
            )
            try:
                if attempt < 2:
                    _wait_for(lambda b=before: _train_lines(killed) > b, proc)
                    if attempt == 1:
                        _wait_for(tmp_dir, proc, timeout=10)  # an async save in flight
                    else:
                        time.sleep(rng.uniform(0.0, 0.5))
                    proc.kill()
                assert proc.wait(timeout=300) in (0, -signal.SIGKILL)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        resumed = re.findall(r'Resumed from .* at step (\d+)', log.read_text())
        if resumed:  # it restored one of the complete steps the previous attempt left
            assert steps_seen and int(resumed[0]) in steps_seen[-1], log.read_text()[-2000:]
        steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
        for step in steps:
            verify_step(str(killed), step, warn=False)  # complete, or no manifest yet
        steps_seen.append(steps)
    assert proc.returncode == 0, log.read_text()[-2000:]
    last = _KILL_OVERRIDES['train.num_steps']
    assert _meta(killed, last)['data_state'] == _meta(tmp_path / 'straight', last)['data_state']
    a, b = _params_at(tmp_path / 'straight', last), _params_at(killed, last)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_train_py_out_of_memory_is_one_line_error(tmp_path):
    """A step that cannot fit (rows of 2^17 tokens: attention scores of tens of TiB, which
    the config check's lower bound in training/footprint.py leaves to the run) stops with one
    `error:` line naming the keys to lower, from XLA's memory analysis of the compiled step
    (`footprint.step_refusal`) before the step runs: no traceback, nothing saved. The child's
    address space capped (`memory_capped`) all the same, so that a step that ran would fail
    there too where the machine overcommits memory (granted, then the process killed by the
    kernel: an H100 host did). The out-of-memory error of a step that does run is
    benchmarks/train_speed.py's test (tests/model/test_flops.py)."""
    run = tmp_path / 'run'
    overrides = {**SMALL, 'data.max_len': 2**17, 'train.num_steps': 2}
    command = [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={run}']
    done = subprocess.run(
        memory_capped(command + command_line(overrides), 32),
        cwd=REPO,
        env=_one_cpu_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    *before, last = done.stderr.strip().splitlines()
    assert last.startswith('error: Out of memory for the training step (') and len(last) <= 200
    assert 'train.batch_size' in last
    assert any("XLA's memory analysis" in x and 'train.grad_accum_steps' in x for x in before)
    assert 'Traceback' not in done.stderr
    assert not list((run / rundir.CHECKPOINTS).iterdir())  # nothing was saved


def test_ctrl_c_seals_the_save_in_flight_and_names_the_step_to_resume_from(tmp_path):
    """Ctrl-C one step after an asynchronous save began: that save is finished and sealed
    (its manifest written) before the run stops, and the message names it."""
    config = tiny_run_config(8)
    config.train.async_checkpointing = True  # step 3's save is in flight at step 4

    def interrupt(step, metrics):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(trainer.Interrupted) as info:
        trainer.train_and_evaluate(config, str(tmp_path), on_step=interrupt)
    assert str(info.value) == (
        f'Interrupted at step 4; the same command resumes from step 3 in {tmp_path}/checkpoints.'
    )
    assert (tmp_path / 'checkpoints' / '3' / rundir.MANIFEST).exists()
    assert verify_step(str(tmp_path), 3)


def test_sigint_stops_train_py_in_one_line_with_exit_code_130(tmp_path):
    """SIGINT (Ctrl-C) to a running train.py: exit code 130 and one line, no traceback."""
    run = tmp_path / 'run'
    # A shell's background jobs ignore SIGINT, and the ignoring is inherited: train.py runs
    # with the default handler, as from a terminal.
    default_sigint = (
        'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); '
        'os.execv(sys.executable, [sys.executable, *sys.argv[1:]])'
    )
    command = [sys.executable, '-c', default_sigint, 'train.py', '--config=configs/tiny.py']
    command.append(f'--workdir={run}')
    settings = {'train.num_steps': 100_000, 'train.log_every': 10, 'train.checkpoint_every': 1000}
    command += command_line({**SMALL, **settings})
    err = tmp_path / 'stderr.txt'
    with open(err, 'w') as stderr:
        proc = subprocess.Popen(
            command, cwd=REPO, env=_one_cpu_env(), stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            _wait_for(lambda: ' step 20/' in err.read_text(), proc)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130
        finally:
            proc.kill()
            proc.wait()
    text = err.read_text()
    assert 'Traceback' not in text
    last = text.strip().splitlines()[-1]
    assert re.fullmatch(
        rf'Interrupted at step \d+, before any checkpoint in {run}/checkpoints: the same '
        r'command starts this run over from step 0\.',
        last,
    )


def test_rerun_of_a_finished_run_trains_and_rewrites_nothing(run_dir, tmp_path):
    """The same command again, or a smaller train.num_steps, once a run (a copy of conftest's
    4-step run) has finished: no step, and config.json / final_metrics.json stay as the
    finished run wrote them (they used to be rewritten: num_steps=2 and final metrics without
    the train / validation entries)."""
    import shutil

    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    first = rundir.read_final_metrics(str(run))
    assert first['step'] == 4 and first['steps_this_run'] == 4  # as the finished run wrote it
    files = {name: (run / name).read_bytes() for name in ('config.json', 'final_metrics.json')}
    for num_steps in (4, 2):
        config = tiny_run_config(num_steps)
        config.train.checkpoint_every = 2  # the command that trained it (tests/conftest.py)
        again = trainer.train_and_evaluate(config, str(run))
        assert again['steps_this_run'] == 0 and again['step'] == 4
        assert again['validation'] == first['validation'] and again['train'] == first['train']
        assert {name: (run / name).read_bytes() for name in files} == files
