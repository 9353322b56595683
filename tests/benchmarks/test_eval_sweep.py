"""benchmarks/eval_sweep.py stopped part-way: what it finished is kept, and a rerun skips it."""

import json
import os
import signal
import time

import pytest

from benchmarks import eval_sweep


@pytest.mark.slow
def test_a_sweep_stopped_after_its_first_row_keeps_it_and_a_rerun_skips_it(
    run_dir, tmp_path, monkeypatch, capsys
):
    """SIGINT right after the first setting's row is saved (a hook, not a race): that row stays
    in the JSON with "stopped after 1 of 2 settings", exit code 130; the same command again
    scores only the second setting."""
    out = tmp_path / 'validation.json'
    argv = [f'--workdir={run_dir}', f'--out={out}', '--beam_size', '1', '2', '--max_examples=3']
    save, saves = eval_sweep._save, []

    def save_then_interrupt(path, table):
        save(path, table)
        saves.append(len(table['rows']))
        if len(saves) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(eval_sweep, '_save', save_then_interrupt)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stop:
        eval_sweep.main(argv)
    assert stop.value.code == 130 and saves == [1, 1]  # once after the row, once stopped
    first = json.loads(out.read_text())
    assert [r['beam_size'] for r in first['rows']] == [1]
    assert first['stopped'] == 'stopped after 1 of 2 settings: interrupted (SIGINT)'
    assert first['stopped'] in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) == before  # restored

    monkeypatch.setattr(eval_sweep, '_save', save)
    rows = eval_sweep.main(argv)
    assert [r['beam_size'] for r in rows] == [1, 2]
    assert rows[0] == first['rows'][0]  # kept as it was, not scored again
    assert '1 of 2 settings already scored at step 4' in capsys.readouterr().out
    again = json.loads(out.read_text())
    assert again['stopped'] is None and again['rows'] == rows


@pytest.mark.slow
def test_a_setting_that_would_end_after_the_stop_time_is_not_started(run_dir, tmp_path, capsys):
    """The first setting always runs (nothing is measured before it); the second, predicted
    from the first, would end after a stop time already past, so the sweep stops there, exit
    code 0, and the table says why."""
    out, launched = tmp_path / 'validation.json', time.time() - 100
    rows = eval_sweep.main(
        [f'--workdir={run_dir}', f'--out={out}', '--beam_size', '1', '2', '--max_examples=3']
        + [f'--stop_at={time.time()}', f'--started_at={launched}']
    )
    assert [r['beam_size'] for r in rows] == [1]
    table = json.loads(out.read_text())
    stopped = table['stopped']
    assert 100 < table['first_s'] < time.time() - launched  # from the launch given
    assert stopped.startswith('stopped after 1 of 2 settings: the next setting (~')
    assert stopped.endswith('would end after the stop time') and stopped in capsys.readouterr().out
