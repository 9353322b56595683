"""transformer.prepare: a run's vocabulary and training token store built without training,
found by the training run that follows; bad input stops in one line and writes nothing."""

import os
import sys

import pytest

from tests.tiny_run import SMALL, command_line, tiny_run_config
from transformer import data, prepare
from transformer.commands import train as trainer
from transformer.data import token_store, tokenizer


def _cli(monkeypatch, *args):
    argv = ['prepare', '--config=configs/tiny.py', *command_line(SMALL), *args]
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its overrides from sys.argv
    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    with pytest.raises(SystemExit) as info:
        prepare.cli(argv)
    return info.value.code


@pytest.mark.slow
def test_prepare_builds_what_training_then_finds(tmp_path, monkeypatch):
    workdir = tmp_path / 'run'
    assert _cli(monkeypatch, f'--workdir={workdir}') is None
    (store,) = [p for p in os.listdir(workdir / 'data_cache') if p.endswith('.store')]
    assert os.path.isfile(workdir / 'vocab' / 'spm.model')
    assert _cli(monkeypatch, f'--workdir={workdir}') is None  # again: nothing to build

    def built_again(*args, **kwargs):
        raise AssertionError('prepared data must be reused')

    monkeypatch.setattr(token_store, 'build', built_again)
    monkeypatch.setattr(tokenizer, 'train_tokenizer', built_again)
    final = trainer.train_and_evaluate(tiny_run_config(1), str(workdir))
    assert final['step'] == 1
    assert [p for p in os.listdir(workdir / 'data_cache') if p.endswith('.store')] == [store]


def test_bad_input_stops_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    workdir = tmp_path / 'run'
    folder = tmp_path / 'empty'
    folder.mkdir()
    flags = ['--config.data.dataset=folder', f'--config.data.folder={folder}']
    assert _cli(monkeypatch, f'--workdir={workdir}', *flags) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: Missing file for split 'train' (en)")
    assert not workdir.exists()


@pytest.mark.slow
def test_verify_reads_every_store_and_refuses_a_damaged_one(tmp_path, monkeypatch, capsys):
    """``--verify``: one line per store; a byte changed in place (size and time kept), which an
    ordinary open does not read, is refused in one line naming the file."""
    workdir = tmp_path / 'run'
    assert _cli(monkeypatch, f'--workdir={workdir}', '--verify') is None
    (store,) = [p for p in (workdir / 'data_cache').iterdir() if p.name.endswith('.store')]
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f'Verified {store}: 200 pairs, ') and 'every checksum matches' in line
    ids = store / 'target_ids.bin'
    before = ids.stat()
    with open(ids, 'r+b') as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(ids, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert data.open_store(str(store)).num_examples > 0  # an open reads sizes and times only
    code = _cli(monkeypatch, f'--workdir={workdir}', '--verify')
    assert code.startswith(f'error: The token store file {ids} fails its checksum; remove ')
    assert '\n' not in code
    assert _cli(monkeypatch, f'--workdir={workdir}') is None  # without --verify: not read
