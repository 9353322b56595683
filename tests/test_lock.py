"""One training process per workdir (transformer/lock.py)."""

import os
import signal
import subprocess
import sys

import pytest

from tests.subprocess_env import repo_env, xla_flags
from tests.tiny_run import tiny_run_config
from transformer import lock
from transformer.commands import train as trainer


@pytest.mark.slow
def test_a_second_training_run_in_a_workdir_stops_in_one_line(tmp_path):
    """While one process holds the lock, a run in the same workdir stops before it writes
    anything, naming the holder; once released, training goes on there."""
    held = lock.acquire(str(tmp_path))
    try:
        with pytest.raises(lock.WorkdirBusy) as info:
            trainer.train_and_evaluate(tiny_run_config(2), str(tmp_path))
    finally:
        lock.release(held)
    assert str(info.value) == (
        f'{tmp_path} is in use by another training run (pid {os.getpid()} on '
        f'{os.uname().nodename}); wait for it to end, or train in another --workdir.'
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock.LOCK_FILE]
    final = trainer.train_and_evaluate(tiny_run_config(2), str(tmp_path))
    assert final['step'] == 2
    lock.release(lock.acquire(str(tmp_path)))  # train_and_evaluate gave it back


def test_the_lock_of_a_killed_process_does_not_block(tmp_path):
    """SIGKILL leaves train.lock behind, but the kernel released its flock with the process."""
    code = (
        'import sys, time; from transformer import lock; '
        'held = lock.acquire(sys.argv[1]); print("held", flush=True); time.sleep(600)'
    )
    env = repo_env(XLA_FLAGS=xla_flags(1))
    proc = subprocess.Popen(
        [sys.executable, '-c', code, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == 'held'
        with pytest.raises(lock.WorkdirBusy, match=f'pid {proc.pid} on '):
            lock.acquire(str(tmp_path))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / lock.LOCK_FILE).exists()
    lock.release(lock.acquire(str(tmp_path)))


@pytest.mark.parametrize('existed', [False, True])
def test_a_run_that_stops_in_set_up_leaves_no_workdir_it_made(tmp_path, existed):
    """A data directory that does not exist stops the run before step 1. The workdir it made
    for itself is removed again; one that was there before stays, lock file and all."""
    workdir = tmp_path / 'run'
    if existed:
        workdir.mkdir()
    config = tiny_run_config(2)
    config.data.dataset = 'multi30k'
    config.data.test_split = 'test2016'  # a split multi30k has (checked when parsed)
    config.data.manual_dir = str(tmp_path / 'no_such_data')
    with pytest.raises(Exception, match='no_such_data'):
        trainer.train_and_evaluate(config, str(workdir))
    if existed:
        assert sorted(p.name for p in workdir.iterdir()) == [lock.LOCK_FILE]
    else:
        assert not workdir.exists()
