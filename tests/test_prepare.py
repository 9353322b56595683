"""transformer.prepare: a run's vocabulary and training token store built without training,
found by the training run that follows; bad input stops in one line and writes nothing."""

import os
import sys

import pytest

from tests.tiny_run import SMALL, command_line, tiny_run_config
from transformer import prepare
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
