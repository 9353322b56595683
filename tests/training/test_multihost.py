"""Scale-out: 2 processes x 4 devices == 1 device, checkpoints that move between process and
device counts, and set-ups that fail fast in one line.

The two-process runs are real: `python train.py` twice, joined by jax.distributed on
localhost (gloo collectives on CPU), started and always ended by the test.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.shared_dirs import built_once
from tests.subprocess_env import xla_flags
from tests.tiny_run import SMALL, command_line, tiny_run_config
from transformer.checkpoint import best_step, load_model, verify_step
from transformer.commands import train as trainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(mode: str, num_steps: int):
    """`tiny_run_config` (no validation BLEU) in ``mode``, a checkpoint every 2 steps."""
    config = tiny_run_config(num_steps)
    config.train.parallelism = mode
    config.train.checkpoint_every = 2
    if mode == 'pmap':
        # pmap folds each device's index into its dropout key, so only dropout 0 can equal
        # one device; 'sharding' draws the same global mask on any layout.
        config.model.dropout_rate = 0.0
    return config


def _overrides(config, extra_keys=()) -> list[str]:
    """The command-line flags that turn configs/tiny.py into ``config``."""
    keys = [*SMALL, 'model.dropout_rate', 'train.num_steps', 'train.log_every']
    keys += ['train.eval_every', 'train.checkpoint_every', 'train.async_checkpointing']
    keys += ['train.parallelism', 'eval.bleu_every', *extra_keys]

    def value(key):
        node = config
        for part in key.split('.'):
            node = node[part]
        return node

    return command_line({key: value(key) for key in keys})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


def _run_two_processes(
    flags, run_dir, *, devices_per_process=4, script='train.py', env=None, timeout=240
) -> list[tuple[int, str]]:
    """``script`` as processes 0 and 1 of one run on localhost: (exit code, output) each.
    Both are always ended, whatever happens. ``run_dir``: the workdir of both, or a pair of
    them (one each)."""
    env = {
        **os.environ,
        'XLA_FLAGS': xla_flags(devices_per_process),
        'JAX_PLATFORMS': 'cpu',  # the CPU devices above, also on a machine with a GPU
        **(env or {}),
    }
    port = _free_port()
    workdirs = run_dir if isinstance(run_dir, list | tuple) else [run_dir, run_dir]
    base = [sys.executable, script, '--config=configs/tiny.py']
    base += [*flags, '--config.train.distributed=True']
    base += [f'--config.train.coordinator_address=localhost:{port}']
    base += ['--config.train.num_processes=2']
    procs = []
    try:
        for pid in (0, 1):
            cmd = [*base, f'--config.train.process_id={pid}', f'--workdir={workdirs[pid]}']
            procs.append(
                subprocess.Popen(
                    cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            )
        outputs = [p.communicate(timeout=timeout)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


def _train_two_processes(config, run_dir, extra=()) -> None:
    results = _run_two_processes([*_overrides(config), *extra], run_dir)
    for code, out in results:
        assert code == 0, out[-3000:]
    outputs = [out for _, out in results]
    assert 'step 1/' in outputs[0] and 'step 1/' not in outputs[1]  # only process 0 logs


def _losses(run_dir) -> dict[int, float]:
    records = [json.loads(line) for line in open(os.path.join(run_dir, 'metrics.jsonl'))]
    return {r['step']: r['loss'] for r in records if r['split'] == 'train'}


def _params(run_dir, step):
    return load_model(str(run_dir), step=step)[3]


def _assert_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=atol)


@pytest.fixture(scope='module')
def one_device(tmp_path_factory):
    """6 steps of `_config` in sharding mode (dropout on), without validation BLEU, on one
    device: the run both two-process training tests compare with, trained once for all
    pytest-xdist workers (tests/shared_dirs.py); read it only."""

    def train(workdir):
        config = _config('sharding', 6)
        trainer.train_and_evaluate(config, str(workdir), devices=jax.devices('cpu')[:1])

    return built_once(tmp_path_factory, 'multihost_one_device', train)


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['sharding', pytest.param('pmap', marks=pytest.mark.long)])
def test_two_processes_equal_one_process_and_one_device(mode, tmp_path, request):
    """4 steps as 2 processes x 4 devices and as 1 device: same logged losses and parameters
    within 1e-5 (1 process x 8 devices runs the program of the data-only layout, which
    tests/training/test_parallel.py equals to 1 device, as it does pmap mode's 8 devices).
    Checkpoints move between process and device counts: the 2-process checkpoint of step 2
    resumes in one process on 2 devices to the 2-process run's step 4; in sharding mode
    (dropout on) the 1-device run goes on to step 6, and the resumed run, from step 4 on
    1 device, arrives at its step-6 parameters."""
    # Without validation BLEU (`_config`'s): its searches across processes are
    # test_multihost_decoding's, and here each of the runs would compile and run one to the
    # length limit.
    config = _config(mode, 4)
    _train_two_processes(config, tmp_path / 'two')
    if mode == 'sharding':  # the same first 4 steps: the schedule ignores num_steps
        one = request.getfixturevalue('one_device')
    else:
        one = tmp_path / 'one'
        trainer.train_and_evaluate(config, str(one), devices=jax.devices('cpu')[:1])
    two = _losses(tmp_path / 'two')
    assert sorted(two) == [1, 2, 3, 4]
    moved = [  # the compared runs train: step 4 is not step 2
        not np.allclose(a, b)
        for a, b in zip(
            *(jax.tree.leaves(_params(tmp_path / 'two', s)) for s in (2, 4)), strict=True
        )
    ]
    assert any(moved)
    got = _losses(one)
    np.testing.assert_allclose([got[s] for s in two], list(two.values()), rtol=1e-5)
    _assert_close(_params(one, 4), _params(tmp_path / 'two', 4))
    resumed = tmp_path / 'resumed'
    shutil.copytree(tmp_path / 'two', resumed)
    shutil.rmtree(resumed / 'checkpoints' / '4')
    trainer.train_and_evaluate(config, str(resumed), devices=jax.devices('cpu')[:2])
    _assert_close(_params(resumed, 4), _params(tmp_path / 'two', 4))
    if mode == 'sharding':
        trainer.train_and_evaluate(_config(mode, 6), str(resumed), devices=jax.devices('cpu')[:1])
        _assert_close(_params(resumed, 6), _params(one, 6))


@pytest.mark.slow
def test_unreachable_coordinator_is_one_line_and_no_hang(tmp_path):
    """Process 1 of a run whose coordinator never starts stops after train.init_timeout_s."""
    config = _config('sharding', 2)
    port = _free_port()
    cmd = [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={tmp_path}']
    cmd += [
        *_overrides(config),
        '--config.train.distributed=True',
        '--config.train.num_processes=2',
    ]
    cmd += [f'--config.train.coordinator_address=localhost:{port}']
    cmd += ['--config.train.process_id=1', '--config.train.init_timeout_s=1']
    start = time.monotonic()
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith('error: No coordinator answers at localhost:') and 'init_timeout_s' in last
    )
    assert time.monotonic() - start < 60


def _results(outputs) -> list[dict]:
    return [
        json.loads(line.split('RESULT ', 1)[1])
        for out in outputs
        for line in out.splitlines()
        if line.startswith('RESULT ')
    ]


def _flip_params(run_dir, step) -> None:
    files = [p for p in (run_dir / 'checkpoints' / str(step) / 'params').rglob('*') if p.is_file()]
    target = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[1000:1064] = bytes(b ^ 0xFF for b in data[1000:1064])
    target.write_bytes(bytes(data))


@pytest.mark.slow
def test_model_axis_across_processes_and_decisions_made_once(one_device, tmp_path):
    """2 processes x 1 device with train.model_parallelism=2: both processes hold data index
    0 of the (1 data x 2 model) mesh, so both feed the whole batch.

    - The losses equal those of one device (1e-5; the same training, the run
      test_two_processes_equal_one_process_and_one_device compares with).
    - A fresh run has one vocabulary, trained once (by process 0).
    - Each process is given other validation BLEU scores (process 0: 10, 9, 8, 12; process 1:
      5, 6, 7, 8): process 0's decide, on both, that step 2 is the best and that patience 2
      stops the run at step 6 (alone, process 1 would save a new best at steps 4 and 6, a
      collective process 0 never enters, and train on).
    - Then step 6 is corrupted: the rerun quarantines it, resumes from step 4 on both
      processes (no hang) and arrives at the same step-6 parameters.
    """
    config = _config('sharding', 8)
    config.train.model_parallelism = 2
    config.train.async_checkpointing = True
    config.eval.bleu_every = 2
    config.train.early_stop_patience = 2
    flags = _overrides(config, ['train.model_parallelism', 'train.early_stop_patience'])
    env = {'TEST_BLEU': json.dumps([[10, 9, 8, 12], [5, 6, 7, 8]])}
    run = tmp_path / 'two'
    worker = os.path.join('tests', 'multihost_worker.py')
    results = _run_two_processes(flags, run, devices_per_process=1, script=worker, env=env)
    for code, out in results:
        assert code == 0, out[-3000:]
    outputs = [out for _, out in results]
    decided = {'step': 6, 'stopped_early': True}
    decided['best'] = {'step': 2, 'score': 10.0, 'evals_since_best': 2}
    assert _results(outputs) == [decided, decided]
    assert best_step(str(run)) == 2
    assert sorted(_losses(run)) == [1, 2, 3, 4, 5, 6]
    assert outputs[0].count('TRAINED VOCABULARY') == 1 and 'TRAINED VOCABULARY' not in outputs[1]
    assert outputs[0].count('BUILT TOKEN STORE') == 1 and 'BUILT TOKEN STORE' not in outputs[1]
    assert os.listdir(run / 'vocab') == ['spm.model']

    got, want = _losses(one_device), _losses(run)
    np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=1e-5)

    before = _params(run, 6)
    _flip_params(run, 6)
    results = _run_two_processes(flags, run, devices_per_process=1, script=worker, env=env)
    for code, out in results:
        assert code == 0, out[-3000:]
    outputs = [out for _, out in results]
    assert 'Resuming from step 4, the newest intact one' in outputs[0]
    assert _results(outputs) == [decided, decided]
    assert [p.name.split('-')[0] for p in (run / 'corrupt_checkpoints').iterdir()] == ['6']
    assert verify_step(str(run), 6)
    _assert_close(_params(run, 6), before)


def test_a_layout_no_split_of_the_batch_fits_is_refused_before_writing(tmp_path):
    """2 processes x 3 devices with train.model_parallelism=2: process 0 holds data indices
    0-1 of the (3 x 2) mesh, process 1 holds 1-2, and no block of rows fits each. Both
    processes stop with one line before the run directory exists."""
    config = _config('sharding', 2)
    config.train.model_parallelism = 2
    config.train.batch_size = 12
    flags = _overrides(config, ['train.model_parallelism'])
    run = tmp_path / 'run'
    for code, out in _run_two_processes(flags, run, devices_per_process=3, timeout=120):
        assert code == 2 and 'Traceback' not in out, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith('error: ')]
        assert len(errors) == 1 and 'no split of the batch fits' in errors[0], out[-3000:]
        assert 'train.model_parallelism' in errors[0]
    assert not run.exists()


def test_processes_that_do_not_share_the_workdir_stop_in_one_line(tmp_path):
    """Processes 0 and 1 given workdirs that are not one directory (as hosts without a shared
    file system see theirs): both stop in one line before a vocabulary or token store is
    built."""
    config = _config('sharding', 2)
    workdirs = [tmp_path / 'host0', tmp_path / 'host1']
    worker = os.path.join('tests', 'multihost_worker.py')
    results = _run_two_processes(
        _overrides(config), workdirs, devices_per_process=1, script=worker, timeout=120
    )
    for code, out in results:
        assert code == 1 and 'Traceback' not in out, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith('error: ')]
        assert len(errors) == 1 and 'do not all see the same' in errors[0], out[-3000:]
        assert 'shared_check' in errors[0] and 'TRAINED VOCABULARY' not in out
