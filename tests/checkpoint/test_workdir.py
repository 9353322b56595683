"""The run directory: checkpoint loading and averaging, and its one-line errors."""

import json
import shutil

import jax
import numpy as np
import pytest

from transformer import rundir
from transformer.checkpoint import CorruptCheckpoint, checkpoint_steps, load_model, verify_step


def test_average_of_two_checkpoints_is_their_mean(run_dir):
    """--average_last 2 loads the element-wise mean of the step-2 and step-4 parameters."""
    _, _, _, averaged, steps = load_model(str(run_dir), average_last=2)
    assert steps == [2, 4]
    _, _, _, p2, _ = load_model(str(run_dir), step=2)
    _, _, _, p4, _ = load_model(str(run_dir), step=4)
    changed = 0
    for a, x, y in zip(*(jax.tree.leaves(t) for t in (averaged, p2, p4)), strict=True):
        np.testing.assert_allclose(a, (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6)
        changed += int(not np.allclose(x, y))
    assert changed > 0  # the two checkpoints differ, so the mean is not trivially either


def test_average_can_end_at_an_earlier_step(run_dir):
    """--step N with --average_last K averages the K checkpoints up to N (an earlier point
    of the run as a shorter run's average); --step alone is that checkpoint."""
    run = str(run_dir)
    assert checkpoint_steps(run, step=4, average_last=2) == [2, 4]
    assert checkpoint_steps(run, step=2, average_last=2) == [2]  # none saved before 2
    assert checkpoint_steps(run, step=4) == [4]
    _, _, _, up_to_4, steps = load_model(run, step=4, average_last=2)
    assert steps == [2, 4]
    _, _, _, latest_two, _ = load_model(run, average_last=2)
    for x, y in zip(jax.tree.leaves(up_to_4), jax.tree.leaves(latest_two), strict=True):
        np.testing.assert_array_equal(x, y)
    _, _, _, at_2, steps = load_model(run, step=2, average_last=2)
    _, _, _, only_2, _ = load_model(run, step=2)
    assert steps == [2]
    for x, y in zip(jax.tree.leaves(at_2), jax.tree.leaves(only_2), strict=True):
        np.testing.assert_array_equal(x, y)


def test_missing_workdir_checkpoint_and_vocab_are_one_line_errors(run_dir, tmp_path):
    """No config, no checkpoints, an unknown step, no vocabulary: a WorkdirError whose
    single line names what is missing, not a traceback from inside Orbax."""
    with pytest.raises(rundir.WorkdirError, match='config.json not found'):
        load_model(str(tmp_path / 'nowhere'))
    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    with pytest.raises(rundir.WorkdirError, match=r'No checkpoint for step 3.*\[2, 4\]'):
        load_model(str(broken), step=3)
    shutil.rmtree(broken / 'vocab')
    with pytest.raises(rundir.WorkdirError, match='No vocabulary'):
        load_model(str(broken))
    shutil.copytree(run_dir / 'vocab', broken / 'vocab')
    shutil.rmtree(broken / 'checkpoints')
    with pytest.raises(rundir.WorkdirError, match='No checkpoints'):
        load_model(str(broken))


def test_checkpoint_of_another_model_shape_is_a_clear_error(run_dir, tmp_path):
    """A config.json whose model differs from the saved parameters fails with one line."""
    other = tmp_path / 'other'
    shutil.copytree(run_dir, other)
    config = json.loads((other / 'config.json').read_text())
    config['model']['d_ff'] = 48
    (other / 'config.json').write_text(json.dumps(config))
    with pytest.raises(rundir.WorkdirError, match='does not fit the model') as info:
        load_model(str(other))
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
    with pytest.raises(rundir.WorkdirError) as info:
        load_model(str(partial), step=4)
    assert '\n' not in str(info.value)


def _params_file(run, step):
    """The largest parameter data file of a step (where the weights' bytes are)."""
    files = [p for p in (run / 'checkpoints' / str(step) / 'params').rglob('*') if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def _flip(file, offset=1000, count=64):
    data = bytearray(file.read_bytes())
    data[offset : offset + count] = bytes(b ^ 0xFF for b in data[offset : offset + count])
    file.write_bytes(bytes(data))


def test_every_step_is_sealed_with_a_manifest_that_verifies(run_dir):
    """Training writes checkpoints/<step>/manifest.json (size + sha256 per file) for each step
    once Orbax has committed it; both steps verify."""
    for step in (2, 4):
        manifest = json.loads((run_dir / 'checkpoints' / str(step) / rundir.MANIFEST).read_text())
        assert any(name.startswith('params/') for name in manifest['files'])
        assert verify_step(str(run_dir), step) is True


@pytest.mark.parametrize('command', ['evaluate', 'translate', 'visualize'])
def test_corrupted_checkpoint_stops_every_command_with_one_line(run_dir, tmp_path, command):
    """64 flipped bytes in a parameter file: the commands that load a model stop (non-zero
    exit) with one line naming the step and the file, before decoding anything."""
    from transformer import evaluate, translate, visualize

    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    flipped = _params_file(broken, 4)
    _flip(flipped)
    cli = {'evaluate': evaluate.cli, 'translate': translate.cli, 'visualize': visualize.cli}
    (tmp_path / 'in').write_text('x\n')
    argv = [command, f'--workdir={broken}', '--step=4', '--text=x', f'--input={tmp_path}/in']
    argv = [a for a in argv if command == 'visualize' or not a.startswith('--text')]
    argv = [a for a in argv if command == 'translate' or not a.startswith('--input')]
    with pytest.raises(SystemExit) as info:
        cli[command](argv)
    message = str(info.value.code)
    assert 'step 4' in message and flipped.name in message and 'failed verification' in message
    assert '\n' not in message


def test_truncated_missing_and_unsealed_checkpoints(run_dir, tmp_path, caplog):
    """A truncated file and a missing file are named; a step without manifest (written
    before checksums, or killed before sealing) loads with a one-line warning."""
    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    data_file = _params_file(broken, 4)
    data_file.write_bytes(data_file.read_bytes()[:100])
    with pytest.raises(CorruptCheckpoint, match=rf'step 4 .*{data_file.name} has 100'):
        load_model(str(broken))
    data_file.unlink()
    with pytest.raises(CorruptCheckpoint, match=f'{data_file.name} is missing'):
        load_model(str(broken), average_last=2)
    (broken / 'checkpoints' / '2' / rundir.MANIFEST).unlink()
    _, _, _, _, steps = load_model(str(broken), step=2)
    assert steps == [2]
    assert 'step 2' in caplog.text and 'no manifest.json' in caplog.text


def test_resume_skips_a_corrupted_step_and_continues_exactly(run_dir, tmp_path, caplog):
    """Training resumes from the newest intact step (with a warning), moves the corrupt
    step aside, and re-trains to the same parameters; with no intact step it stops."""
    from tests.tiny_run import tiny_run_config
    from transformer.commands import train as trainer

    config = tiny_run_config(4)
    config.train.checkpoint_every = 2
    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    _flip(_params_file(broken, 4))
    final = trainer.train_and_evaluate(config, str(broken))
    assert final['steps_this_run'] == 2
    assert 'Resuming from step 2, the newest intact one' in caplog.text
    assert list((broken / 'corrupt_checkpoints').iterdir())
    _, _, _, expected, _ = load_model(str(run_dir), step=4)
    _, _, _, got, _ = load_model(str(broken), step=4)
    for x, y in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(x, y)
    for step in (2, 4):
        _flip(_params_file(broken, step))
    with pytest.raises(rundir.WorkdirError, match=r'No intact checkpoint.*\[4, 2\]') as info:
        trainer.train_and_evaluate(config, str(broken))
    assert '\n' not in str(info.value)


def test_unsealed_step_resumes_unverified_and_is_never_sealed_afterwards(run_dir, tmp_path):
    """A step committed by a run killed before its manifest: resuming restores it with a
    one-line warning and leaves it unsealed (hashing bytes nobody saw written would certify
    them); the steps this run saves are sealed."""
    from tests.tiny_run import tiny_run_config
    from transformer.commands import train as trainer

    config = tiny_run_config(6)
    config.train.checkpoint_every = 2
    unsealed = tmp_path / 'unsealed'
    shutil.copytree(run_dir, unsealed)
    manifest = unsealed / 'checkpoints' / '4' / rundir.MANIFEST
    manifest.unlink()
    final = trainer.train_and_evaluate(config, str(unsealed))
    assert final['steps_this_run'] == 2
    assert not manifest.exists() and verify_step(str(unsealed), 6)


def test_unreadable_unsealed_step_falls_back_once_an_older_step_fits(run_dir, tmp_path, caplog):
    """An unsealed newest step whose files cannot be read: training falls back to the older
    step (which restores with this config), moves the bad one aside with a line naming the
    read error, and re-trains to the same parameters. With a config that fits no step the
    run stops on the config and moves nothing."""
    from tests.tiny_run import tiny_run_config
    from transformer.commands import train as trainer

    config = tiny_run_config(4)
    config.train.checkpoint_every = 2
    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    (broken / 'checkpoints' / '4' / rundir.MANIFEST).unlink()
    data_file = _params_file(broken, 4)
    data_file.write_bytes(data_file.read_bytes()[:100])
    changed = tiny_run_config(4)
    changed.model.d_ff = 48
    saved_config = (broken / 'config.json').read_bytes()
    # The changed model as the run's own, else it is refused from config.json at once.
    rundir.write_config(str(broken), changed)
    with pytest.raises(rundir.WorkdirError, match='does not fit this config'):
        trainer.train_and_evaluate(changed, str(broken))
    assert not (broken / 'corrupt_checkpoints').exists() and data_file.exists()
    (broken / 'config.json').write_bytes(saved_config)
    caplog.clear()
    final = trainer.train_and_evaluate(config, str(broken))
    assert final['steps_this_run'] == 2
    lines = [r.getMessage() for r in caplog.records if 'could not be read' in r.getMessage()]
    assert len(lines) == 1 and 'Checkpoint step 4 (no manifest)' in lines[0]
    assert 'Resuming from step 2' in lines[0] and 'model or optimizer' not in lines[0]
    assert [p.name.split('-')[0] for p in (broken / 'corrupt_checkpoints').iterdir()] == ['4']
    _, _, _, expected, _ = load_model(str(run_dir), step=4)
    _, _, _, got, _ = load_model(str(broken), step=4)
    for x, y in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_step_is_sealed_when_it_commits_so_later_changes_are_caught(tmp_path):
    """Asynchronous saves: the manifest of step 2 is written once Orbax commits it, before
    the next save begins, so bytes changed after the commit (here at step 3) fail
    verification instead of being certified by a manifest written at step 4's save."""
    import time

    from tests.tiny_run import tiny_run_config
    from transformer.commands import train as trainer

    config = tiny_run_config(4)
    config.train.checkpoint_every = 2
    config.train.async_checkpointing = True
    manifest = tmp_path / 'checkpoints' / '2' / rundir.MANIFEST
    seen = {}

    def corrupt_after_commit(step, metrics):
        if step == 3:
            deadline = time.monotonic() + 60
            while not manifest.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            seen['sealed before step 4'] = manifest.exists()
            _flip(_params_file(tmp_path, 2))

    # One device: what is checked is when the manifest is written, not the layout.
    one_device = jax.devices('cpu')[:1]
    trainer.train_and_evaluate(
        config, str(tmp_path), devices=one_device, on_step=corrupt_after_commit
    )
    assert seen == {'sealed before step 4': True}
    with pytest.raises(CorruptCheckpoint, match='step 2 .*failed verification'):
        verify_step(str(tmp_path), 2)
    assert verify_step(str(tmp_path), 4)


def test_temporary_directories_of_killed_saves_are_removed_on_start(run_dir, tmp_path):
    """Orbax's `<step>.orbax-checkpoint-tmp-*` directories of a save killed half-way are
    never read; the next training run removes them (they would leak disk)."""
    from tests.tiny_run import tiny_run_config
    from transformer.commands import train as trainer

    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    left = run / 'checkpoints' / '6.orbax-checkpoint-tmp-1764133000'
    (left / 'params').mkdir(parents=True)
    (left / 'params' / 'data').write_bytes(b'x' * 1000)
    config = tiny_run_config(5)
    config.train.checkpoint_every = 2
    trainer.train_and_evaluate(config, str(run))
    assert not left.exists()
    assert sorted(p.name for p in (run / 'checkpoints').iterdir()) == ['2', '4', '5']


# The training run of the full-disk test, in a process of its own: the file-size limit is
# process-wide, and in a test worker it would also cut the writes of everything else there,
# and Orbax's failed writes report their errors when their event loop is collected, after the
# test. The limit starts after step 5, when everything is compiled: the entries of the shared
# compilation cache are larger than it.
FULL_DISK = r"""
import json, resource, signal, sys
from tests.tiny_run import tiny_run_config
from transformer import rundir
from transformer.commands import train as trainer

config = tiny_run_config(6)
config.train.checkpoint_every = 2
config.train.async_checkpointing = True
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def limit_files_after_step_5(step, metrics):
    if step == 5:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, hard))


try:
    trainer.train_and_evaluate(config, sys.argv[1], on_step=limit_files_after_step_5)
except rundir.WorkdirError as e:
    print(json.dumps({'error': str(e)}), flush=True)
"""


@pytest.mark.slow
def test_full_disk_while_saving_is_one_line_and_keeps_earlier_steps(run_dir, tmp_path):
    """Checkpoint files that the OS refuses to write (async checkpoints): one line naming
    the step, and the steps saved before still verify.

    Tests run as root, for whom chmod does not stop writes, and cannot mount a small disk;
    a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) makes the kernel refuse every
    write past 40 kB with EFBIG, as a full disk refuses with ENOSPC: parameter files are
    larger, metrics and logs smaller. The refusal comes from the OS inside tensorstore's
    writer thread, with no Python code patched."""
    import subprocess
    import sys

    from tests.subprocess_env import REPO, repo_env, xla_flags

    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    # On one CPU device (the run resumes on any number): its programs compile faster.
    proc = subprocess.run(
        [sys.executable, '-c', FULL_DISK, str(run)],
        cwd=REPO, env=repo_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    errors = [json.loads(line)['error'] for line in lines if line.startswith('{')]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert 'Could not write checkpoint step 6' in errors[0], errors[0]
    assert '\n' not in errors[0] and 'intact: [2, 4]' in errors[0]
    assert all(verify_step(str(run), s) for s in (2, 4))
    assert not (run / 'checkpoints' / '6').exists()


@pytest.mark.slow
def test_read_only_checkpoints_stop_train_py_in_one_line_at_once(run_dir, tmp_path):
    """A checkpoints directory that refuses new steps (async saves): train.py, resuming a
    copy of conftest's run (steps 2 and 4) with its own settings, stops with one line naming
    the step and the steps kept, within seconds. (Orbax made step directories in the
    background; when that failed its other save threads waited 300 s and the process could
    not exit.) chmod 0555 refuses writes to all but root; as root, the process runs without
    the capability to override file permissions (util-linux setpriv)."""
    import os
    import subprocess
    import sys

    from tests.subprocess_env import repo_env, xla_flags
    from tests.tiny_run import SMALL, command_line

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prefix = []
    if os.geteuid() == 0:
        if shutil.which('setpriv') is None:
            pytest.skip('running as root without setpriv: chmod cannot refuse writes')
        prefix = ['setpriv', '--bounding-set=-dac_override,-dac_read_search']
    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    # tests/tiny_run.py's tiny_run_config as flags, with asynchronous saves, 2 steps more.
    settings = {**SMALL, 'model.dropout_rate': 0.1, 'train.log_every': 1, 'train.eval_every': 0}
    settings |= {'train.checkpoint_every': 2, 'train.async_checkpointing': True}
    settings |= {'eval.bleu_every': 0, 'train.num_steps': 6}
    command = [*prefix, sys.executable, 'train.py', '--config=configs/tiny.py']
    command += [f'--workdir={run}', *command_line(settings)]
    (run / rundir.CHECKPOINTS).chmod(0o555)
    # On one CPU device (the run resumes on any number): its programs compile faster.
    env = repo_env(XLA_FLAGS=xla_flags(1))
    try:
        done = subprocess.run(
            command, cwd=repo, env=env, capture_output=True, text=True, timeout=240
        )
    finally:
        (run / rundir.CHECKPOINTS).chmod(0o755)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith('error: Could not write checkpoint step 6 ') and 'Permission' in last
    assert last.endswith('Steps saved before are intact: [2, 4].')
    assert 'Traceback' not in done.stderr
    assert all(verify_step(str(run), s) for s in (2, 4))


def test_a_config_json_that_is_not_json_is_one_line(tmp_path):
    (tmp_path / rundir.CONFIG_FILE).write_text('{"model": ')
    with pytest.raises(rundir.WorkdirError) as info:
        rundir.read_config(str(tmp_path))
    assert str(info.value) == (
        f'{tmp_path}/config.json is not valid JSON (Expecting value: line 1 column 11 '
        '(char 10)); restore it.'
    )


def test_a_directory_that_is_no_run_is_named_whichever_flag_gave_it(run_dir, tmp_path):
    """--workdir or one of --ensemble's directories: the message names that directory (it
    said '--workdir must be ...' for an --ensemble entry too)."""
    from transformer.decoding import ensemble

    missing = tmp_path / 'not_a_run'
    with pytest.raises(rundir.WorkdirError) as info:
        ensemble.load_ensemble([str(run_dir), str(missing)], None, None, False)
    assert str(info.value) == (
        f'{missing}/config.json not found: {missing} is not a run directory written by train.py.'
    )


@pytest.mark.slow
def test_the_default_average_leaves_out_the_warm_up_and_the_first_half(tmp_path, caplog):
    """eval.average_last=4 over steps 2, 4, 6, 8 with a 4-step warm-up: the commands average
    6 and 8 by default and say which steps they left out; --average_last 4 takes all four;
    with nothing after the warm-up the newest step alone is loaded."""
    from tests.tiny_run import tiny_run_config
    from transformer.commands import decoding_run
    from transformer.commands import train as trainer

    config = tiny_run_config(8)
    config.train.checkpoint_every = 2
    config.train.keep_checkpoints = 4
    config.eval.average_last = 4
    config.opt.warmup_steps = 4
    # One device: the steps averaged do not depend on the layout that trained them.
    trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices('cpu')[:1])
    with caplog.at_level('INFO'):
        assert load_model(str(tmp_path))[4] == [6, 8]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Averaging')]
    assert lines == [
        'Averaging steps [6, 8] of the last 4 saved [2, 4, 6, 8] (eval.average_last=4); the '
        'others are in the warm-up (opt.warmup_steps=4) or the first half of training '
        '(--average_last 4 takes them all).'
    ]
    assert load_model(str(tmp_path), average_last=4)[4] == [2, 4, 6, 8]
    # What the decoding commands load (evaluate's scores name these steps:
    # tests/evaluation/test_evaluate.py); decoding would assert nothing more here.
    assert decoding_run.load_run(str(tmp_path)).member_steps == [[6, 8]]
    shutil.rmtree(tmp_path / 'checkpoints' / '6')
    shutil.rmtree(tmp_path / 'checkpoints' / '8')
    caplog.clear()
    with caplog.at_level('INFO'):
        assert load_model(str(tmp_path))[4] == [4]
    # Fewer steps than eval.average_last: one line that agrees with what is averaged.
    # (Not 'verag' anywhere in a line: Orbax's lines name this test's directory, '..._average_...'.)
    said = [r.getMessage() for r in caplog.records]
    lines = [m for m in said if m.startswith(('Averaging', 'Asked to average', 'Average'))]
    assert lines == [
        'Averaging steps [4] of the 2 saved [2, 4] (eval.average_last=4); the others are in '
        'the warm-up (opt.warmup_steps=4) or the first half of training (--average_last 2 '
        'takes them all).'
    ]
