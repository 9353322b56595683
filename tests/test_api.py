"""The Python API as the README and docs/api.md show it: every ```python block of both files
runs, in order, against a small trained run in runs/tiny, and loading a run prints none of
the libraries' routine notes."""

import os
import pathlib
import re

import pytest

from transformer import api

REPO = pathlib.Path(__file__).parents[1]


def _blocks(name: str) -> list[str]:
    return re.findall(r'```python\n(.*?)```', (REPO / name).read_text(), re.S)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['README.md', 'docs/api.md'])
def test_the_documented_python_blocks_run(name, run_dir, tmp_path, monkeypatch):
    blocks = _blocks(name)
    assert blocks, f'{name} has no python block'
    (tmp_path / 'runs').mkdir()
    os.symlink(run_dir, tmp_path / 'runs' / 'tiny')
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in blocks:
        exec(compile(block, name, 'exec'), namespace)
    assert namespace['run'].steps == [4]  # run_dir's newest step (tiny averages 1)


@pytest.mark.slow
def test_loading_a_run_is_quiet_and_leaves_logging_as_it_was(run_dir, caplog):
    import logging

    before = [list(logging.getLogger(n).filters) for n in ('absl', 'sacrebleu')]
    with caplog.at_level('WARNING'):
        run = api.load(str(run_dir))
    assert run.steps == [4]
    assert not [r for r in caplog.records if 'read only' in r.getMessage()]
    assert [list(logging.getLogger(n).filters) for n in ('absl', 'sacrebleu')] == before
