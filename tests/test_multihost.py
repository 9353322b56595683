"""Scale-out: 2 processes x 4 devices == 1 process x 8 devices == 1 device, checkpoints that
move between process and device counts, and set-ups that fail fast in one line.

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

from tests.tiny_run import SMALL, command_line, tiny_run_config
from transformer import trainer, workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(mode: str, num_steps: int):
    config = tiny_run_config(num_steps)
    config.train.parallelism = mode
    config.train.checkpoint_every = 2
    if mode == 'pmap':
        # pmap folds each device's index into its dropout key, so only dropout 0 can equal
        # one device; 'sharding' draws the same global mask on any layout.
        config.model.dropout_rate = 0.0
    return config


def _overrides(config) -> list[str]:
    """The command-line flags that turn configs/tiny.py into ``config``."""
    keys = [*SMALL, 'model.dropout_rate', 'train.num_steps', 'train.log_every']
    keys += ['train.eval_every', 'train.checkpoint_every', 'train.async_checkpointing']
    keys += ['train.parallelism', 'eval.bleu_every']

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


def _train_two_processes(config, run_dir, extra=()) -> None:
    env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}
    port = _free_port()
    base = [sys.executable, 'train.py', '--config=configs/tiny.py', f'--workdir={run_dir}']
    base += [*_overrides(config), *extra, '--config.train.distributed=True']
    base += [f'--config.train.coordinator_address=localhost:{port}']
    base += ['--config.train.num_processes=2']
    procs = []
    try:
        for pid in (0, 1):
            cmd = [*base, f'--config.train.process_id={pid}']
            procs.append(
                subprocess.Popen(
                    cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            )
        outputs = [p.communicate(timeout=240)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    assert 'step 1/' in outputs[0] and 'step 1/' not in outputs[1]  # only process 0 logs


def _losses(run_dir) -> dict[int, float]:
    records = [json.loads(line) for line in open(os.path.join(run_dir, 'metrics.jsonl'))]
    return {r['step']: r['loss'] for r in records if r['split'] == 'train'}


def _params(run_dir, step):
    return workdir.load_model(str(run_dir), step=step)[3]


def _assert_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=atol)


@pytest.mark.parametrize('mode', ['sharding', 'pmap'])
def test_two_processes_equal_one_process_and_one_device(mode, tmp_path):
    """4 steps as 2 processes x 4 devices, 1 process x 8 devices and 1 device: same logged
    losses and parameters within 1e-5; the 2-process checkpoint of step 2 restores in one
    process and continues to the 2-process run's step 4."""
    config = _config(mode, 4)
    _train_two_processes(config, tmp_path / 'two')
    trainer.train_and_evaluate(config, str(tmp_path / 'eight'))
    trainer.train_and_evaluate(config, str(tmp_path / 'one'), devices=jax.devices()[:1])
    two = _losses(tmp_path / 'two')
    assert sorted(two) == [1, 2, 3, 4]
    moved = [  # the compared runs train: step 4 is not step 2
        not np.allclose(a, b)
        for a, b in zip(
            *(jax.tree.leaves(_params(tmp_path / 'two', s)) for s in (2, 4)), strict=True
        )
    ]
    assert any(moved)
    for other in ('eight', 'one'):
        got = _losses(tmp_path / other)
        np.testing.assert_allclose([got[s] for s in two], list(two.values()), rtol=1e-5)
        _assert_close(_params(tmp_path / other, 4), _params(tmp_path / 'two', 4))
    resumed = tmp_path / 'resumed'
    shutil.copytree(tmp_path / 'two', resumed)
    shutil.rmtree(resumed / 'checkpoints' / '4')
    trainer.train_and_evaluate(config, str(resumed), devices=jax.devices()[:1])
    _assert_close(_params(resumed, 4), _params(tmp_path / 'two', 4))


def test_resume_on_8_then_2_then_1_devices_equals_uninterrupted(tmp_path):
    """Sharding mode with dropout: steps 1-2 on 8 devices, 3-4 on 2, 5-6 on 1 == 6 on 8."""
    trainer.train_and_evaluate(_config('sharding', 6), str(tmp_path / 'straight'))
    moved = str(tmp_path / 'moved')
    for num_steps, count in ((2, 8), (4, 2), (6, 1)):
        trainer.train_and_evaluate(
            _config('sharding', num_steps), moved, devices=jax.devices()[:count]
        )
    _assert_close(_params(moved, 6), _params(tmp_path / 'straight', 6))


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
    cmd += ['--config.train.process_id=1', '--config.train.init_timeout_s=2']
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith('error: No coordinator answers at localhost:') and 'init_timeout_s' in last
    )
    assert time.monotonic() - start < 60
