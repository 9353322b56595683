"""Messages agree with what happens: help for a run directory shows that run's settings, the
Python API loads as quietly as docs/api.md says, and a resumed run's metrics hold each step
once."""

import json
import logging
import shutil

import pytest

from transformer import api, evaluate, rundir
from transformer.training import metrics


def _set_eval(workdir, **values):
    file = workdir / rundir.CONFIG_FILE
    config = json.loads(file.read_text())
    config['eval'].update(values)
    file.write_text(json.dumps(config))


def test_help_with_a_workdir_shows_that_runs_settings(run_dir, tmp_path, capsys):
    workdir = tmp_path / 'run'
    shutil.copytree(run_dir, workdir)
    _set_eval(workdir, beam_size=7, alpha=0.25)
    with pytest.raises(SystemExit) as info:
        evaluate.cli(['evaluate', f'--workdir={workdir}', '--help'])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert f'from {workdir}/{rundir.CONFIG_FILE}:' in out
    assert '  eval.beam_size = 7' in out and '  eval.alpha = 0.25' in out
    with pytest.raises(SystemExit):
        evaluate.cli(['evaluate', '--help'])
    assert 'the defaults of configs/base.py (--workdir RUN --help shows its own)' in (
        capsys.readouterr().out
    )


def test_the_api_loads_a_run_with_fewer_checkpoints_than_averaged_quietly(
    run_dir, tmp_path, caplog
):
    """eval.average_last above the steps saved: the default average says what it averages
    in one INFO line, and nothing at WARNING (it printed 'Asked to average the last 5
    checkpoints but only 3 exist' and then 'Averaging steps [300] of the last 3')."""
    workdir = tmp_path / 'run'
    shutil.copytree(run_dir, workdir)
    _set_eval(workdir, average_last=5)
    with caplog.at_level(logging.INFO):
        run = api.load(str(workdir))
    assert run.steps
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    lines = [r.getMessage() for r in caplog.records if 'verag' in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f'Averaging steps {run.steps} of the 2 saved')


def test_a_resumed_run_keeps_each_step_once_in_metrics_jsonl(tmp_path):
    """Steps an interrupted run logged after its last checkpoint are trained again: their
    old records are dropped when the run starts from that checkpoint."""
    path = tmp_path / 'metrics.jsonl'
    writer = metrics.MetricWriter(str(path), str(tmp_path / 'tb'), enabled=True)
    for step in (1, 2, 3, 4):
        writer.write(step, 'train', {'loss': float(step)})
    writer.close()
    writer = metrics.MetricWriter(str(path), str(tmp_path / 'tb'), enabled=True, start_step=2)
    for step in (3, 4):
        writer.write(step, 'train', {'loss': 10.0 + step})
    writer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r['step'], r['loss']) for r in records] == [(1, 1), (2, 2), (3, 13), (4, 14)]
