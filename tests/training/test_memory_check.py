"""The train command refuses a compiled step that needs more memory than the process may still
take (transformer/training/footprint.py, `step_refusal`), before that step runs."""

import json
import shutil
import sys

import jax
import pytest
from absl import flags

from tests.tiny_run import SMALL, command_line
from transformer import rundir
from transformer.backends import host_memory
from transformer.commands import train as trainer

RUN = {
    **SMALL,
    'train.log_every': 1,
    'train.eval_every': 0,
    'eval.bleu_every': 0,
    'train.checkpoint_every': 3,
    'train.async_checkpointing': False,
}


def _forget_config_overrides():
    for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)


@pytest.fixture(autouse=True)
def one_cpu_device(monkeypatch):
    """One CPU device, whatever the machine; ml_collections' --config.KEY flags forgotten
    between the in-process commands (each defines its own)."""
    cpu = jax.devices('cpu')[:1]
    monkeypatch.setattr(jax, 'devices', lambda backend=None: cpu)
    _forget_config_overrides()
    yield
    _forget_config_overrides()


def _train(workdir, monkeypatch, **overrides) -> None:
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}']
    argv += command_line({**RUN, **overrides})
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its overrides from sys.argv
    _forget_config_overrides()
    trainer.cli(argv)


@pytest.mark.slow
def test_a_step_past_the_memory_left_stops_in_one_line_before_it_runs(
    run_dir, tmp_path, monkeypatch, caplog
):
    """conftest's tiny run (4 steps, checkpoints 2 and 4; copied) resumed by the command with
    its settings under a 1 MiB limit: refused before step 5 runs."""
    workdir = tmp_path / 'run'
    shutil.copytree(run_dir, workdir)
    saved = sorted(p.name for p in (workdir / rundir.CHECKPOINTS).iterdir())
    assert saved == ['2', '4']
    monkeypatch.setattr(host_memory, 'available', lambda: (2**20, 'a 1 MiB cgroup'))
    # The tiny run's own settings, which configs/tiny.py with RUN does not hold.
    same = {'model.dropout_rate': 0.1, 'train.checkpoint_every': 2, 'train.num_steps': 6}
    with caplog.at_level('ERROR'), pytest.raises(SystemExit) as info:
        _train(workdir, monkeypatch, **same)
    assert info.value.code not in (0, None)
    line = str(info.value.code)  # what the interpreter prints as it exits with status 1
    assert line.startswith('error: Out of memory for the training step (')
    assert 'left): lower train.batch_size=8 to ' in line or 'shrink the model' in line
    assert '\n' not in line and len(line) <= 200
    assert 'checkpoints already saved are untouched' in line
    detail = [r.getMessage() for r in caplog.records if "XLA's memory analysis" in r.getMessage()]
    assert len(detail) == 1 and detail[0].startswith('train.batch_size=8 x data.max_len=')
    assert 'more than 0.9 MiB, 90% of the 1.0 MiB of host memory (a 1 MiB cgroup)' in detail[0]
    # Before any step: steps 2 and 4's checkpoints are what the workdir holds, and no step 5
    # was logged.
    assert sorted(p.name for p in (workdir / rundir.CHECKPOINTS).iterdir()) == saved
    metrics = (workdir / rundir.METRICS_FILE).read_text().splitlines()
    assert max(json.loads(line)['step'] for line in metrics) == 4
