"""Read-only directories, full disks and a missing optional extra end each command in one
line, and where a command can know beforehand (a directory that takes no file) it says so
before the work that would fill it.

Read-only and full filesystems are real where the machine allows: a small tmpfs mounted for
the test when it runs as root with mount rights, or permission bits for other users (root
writes through them, so that case is detected and skipped with the reason). `CASES` is a
table anyone can extend: a command run against such a directory and the piece of its line.
"""

import contextlib
import errno
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from tests.tiny_run import SMALL, command_line
from transformer import evaluate, export, files, translate
from transformer.commands import train as trainer


def _mount(directory, *options: str) -> str | None:
    """Mounts a tmpfs on ``directory``; None, or why it could not."""
    if os.geteuid() != 0 or shutil.which('mount') is None:
        return 'mounting a small filesystem needs root and mount(8)'
    proc = subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', ','.join(options), 'tmpfs', str(directory)],
        capture_output=True,
        text=True,
    )
    return None if proc.returncode == 0 else f'mount failed: {proc.stderr.strip()}'


@contextlib.contextmanager
def read_only_copy(source, directory):
    """``source`` copied into ``directory``, which then takes no writes."""
    directory.mkdir()
    problem = _mount(directory, 'size=16m')
    if problem is None:  # root: a tmpfs remounted read-only stops every writer
        try:
            shutil.copytree(source, directory, dirs_exist_ok=True)
            subprocess.run(['mount', '-o', 'remount,ro', str(directory)], check=True)
            yield directory
        finally:
            subprocess.run(['umount', '-l', str(directory)], check=False)
        return
    shutil.copytree(source, directory, dirs_exist_ok=True)
    for folder, _, _ in os.walk(directory):
        os.chmod(folder, 0o555)
    try:
        if files.unwritable(str(directory)) is None:
            pytest.skip(f'{directory} takes writes despite chmod (root), and {problem}')
        yield directory
    finally:
        for folder, _, _ in os.walk(directory):
            os.chmod(folder, 0o755)


@contextlib.contextmanager
def full_filesystem(directory, size: str):
    """A tmpfs of ``size`` on ``directory`` (skips where none can be mounted)."""
    directory.mkdir()
    problem = _mount(directory, f'size={size}')
    if problem is not None:
        pytest.skip(problem)
    try:
        yield directory
    finally:
        subprocess.run(['umount', '-l', str(directory)], check=False)


def _run(cli, argv, monkeypatch, capsys) -> str:
    """The one line a command ends with (exit code not 0)."""
    monkeypatch.setattr(sys, 'argv', argv)
    with pytest.raises(SystemExit) as info:
        cli(argv)
    code = info.value.code
    assert code not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    err += [code] if isinstance(code, str) else []
    assert len(err) == 1 and err[0].startswith('error: '), err
    return err[0]


def _train_argv(workdir) -> list[str]:
    settings = {**SMALL, 'train.num_steps': 6, 'train.checkpoint_every': 2}
    settings |= {'train.log_every': 1, 'train.eval_every': 0, 'model.dropout_rate': 0.1}
    settings |= {'train.async_checkpointing': False}
    return ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}', *command_line(settings)]


@pytest.fixture(autouse=True)
def fresh_overrides(monkeypatch):
    from absl import flags

    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)


# (id, command, its argv given the read-only run and a writable folder, the line's piece)
CASES = [
    (
        'evaluate into the run',
        evaluate.cli,
        lambda run, out: ['evaluate', f'--workdir={run}', '--max_examples=2'],
        'eval (Read-only file system); --output FILE writes them elsewhere.',
    ),
    (
        'resume training',
        trainer.cli,
        lambda run, out: _train_argv(run),
        'train.lock: Read-only file system.',
    ),
    (
        'translate into it',
        translate.cli,
        lambda run, out: ['translate', f'--workdir={out}', f'--output={run}/out.txt'],
        'is not writable (Read-only file system)',
    ),
    (
        'export into it',
        export.cli,
        lambda run, out: ['export', f'--workdir={out}', f'--out={run}/hf'],
        '(Read-only file system); --out names another place.',
    ),
]


@pytest.mark.parametrize('name, cli, argv, message', CASES, ids=[c[0] for c in CASES])
def test_a_read_only_directory_is_one_line_before_the_work(
    name, cli, argv, message, run_dir, tmp_path, monkeypatch, capsys
):
    writable = tmp_path / 'writable'
    shutil.copytree(run_dir, writable)
    with read_only_copy(run_dir, tmp_path / 'ro') as run:
        line = _run(cli, argv(run, writable), monkeypatch, capsys)
    assert message in line, line
    assert 'Read-only' in line or 'Permission denied' in line


def test_a_full_disk_while_writing_the_vocabulary_is_one_line(tmp_path, monkeypatch, capsys):
    with full_filesystem(tmp_path / 'small', '16k') as small:
        line = _run(trainer.cli, _train_argv(small / 'run'), monkeypatch, capsys)
    assert line.startswith('error: cannot write ') and 'No space left on device' in line, line


@pytest.mark.slow
def test_a_full_disk_while_writing_the_hypotheses_is_one_line(
    run_dir, tmp_path, monkeypatch, capsys
):
    with full_filesystem(tmp_path / 'small', '4k') as small:
        (small / 'filler').write_bytes(b'x' * 4096)
        argv = ['evaluate', f'--workdir={run_dir}', '--max_examples=2', f'--output={small}/h.txt']
        line = _run(evaluate.cli, argv, monkeypatch, capsys)
    assert line == f'error: cannot write {small}/h.txt: No space left on device.', line


def test_os_error_line_names_the_file_and_the_reason():
    full = OSError(errno.ENOSPC, 'No space left on device', '/x/vocab/spm.model')
    assert files.os_error_line(full) == 'cannot write /x/vocab/spm.model: No space left on device.'
    gone = FileNotFoundError(errno.ENOENT, 'No such file or directory', '/x/y')
    assert files.os_error_line(gone) == 'No such file or directory: /x/y'


def test_a_missing_export_extra_names_the_pip_command(run_dir, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, 'find_spec', lambda name, *a: None if name == 'safetensors' else real(name)
    )
    out = tmp_path / 'hf'
    line = _run(export.cli, ['export', f'--workdir={run_dir}', f'--out={out}'], monkeypatch, capsys)
    assert "safetensors is not installed): pip install 'transformer[export]'" in line, line
    assert not out.exists() and os.listdir(tmp_path) == []
