"""benchmarks/multi30k_sweep.py and its helpers (benchmarks/sweep_jobs.py): seeds trained side
by side, one decoding choice per recipe on the mean validation BLEU, the test split scored
once per seed, mean +- std; on CPU with tiny settings."""

import json
import os
import signal
import statistics
import sys
import time

import pytest

from benchmarks import multi30k_sweep, sweep_jobs, sweep_report
from tests.tiny_run import SMALL


def test_the_choice_is_the_best_mean_over_seeds_not_one_seeds_best():
    """Seed 0 alone would pick beam 1; the mean over both seeds picks beam 2."""
    setting = {'average_last': 1, 'alpha': 0.6, 'length_penalty': 'gnmt'}
    seed0 = [setting | {'beam_size': 1, 'bleu': 30.0}, setting | {'beam_size': 2, 'bleu': 29.0}]
    seed1 = [setting | {'beam_size': 1, 'bleu': 20.0}, setting | {'beam_size': 2, 'bleu': 25.0}]
    choice, mean, left_out = sweep_report.choose({0: seed0, 1: seed1}, 'bleu')
    assert choice == setting | {'beam_size': 2} and mean == 27.0 and left_out == []


def test_the_choice_is_among_the_settings_every_scored_seed_finished():
    """Seed 0 finished 3 settings, seed 1 (stopped) 2: the third, seed 0's best by far, is not
    chosen, since seed 1 has no score at it; a seed that shares no setting is left out."""
    setting = {'average_last': 1, 'alpha': 0.6}
    rows = [setting | {'beam_size': b, 'length_penalty': p} for b, p in ((1, 'gnmt'), (2, 'gnmt'))]
    third = setting | {'beam_size': 2, 'length_penalty': 'fairseq'}
    seed0 = [rows[0] | {'bleu': 30.0}, rows[1] | {'bleu': 31.0}, third | {'bleu': 60.0}]
    seed1 = [rows[0] | {'bleu': 20.0}, rows[1] | {'bleu': 25.0}]
    choice, mean, left_out = sweep_report.choose({0: seed0, 1: seed1}, 'bleu')
    assert choice == rows[1] and mean == 28.0 and left_out == []
    other = setting | {'beam_size': 4, 'length_penalty': 'gnmt', 'bleu': 99.0}
    choice, _, left_out = sweep_report.choose({0: seed0, 1: seed1, 2: [other]}, 'bleu')
    assert choice == rows[1] and left_out == [2]


def test_a_recipe_without_validation_scores_keeps_its_training_columns():
    """No choice (every validation was cut): the table still has each run's updates, steps/s
    and compile time, '-' for what is missing, and no mean row."""
    run = {'recipe': 'a', 'workdir': 'w', 'train_s': 9.0, 'stopped_at_deadline': True}
    run |= {'updates': 20, 'compile_s': 12.5, 'steps_per_s': 41.25, 'planned_steps': 30}
    runs = {('a', 0): run | {'seed': 0}, ('a', 1): run | {'seed': 1, 'updates': None}}
    recipe_runs = sweep_report.recipe_runs('a', None, [0, 1, 2], runs, {}, {}, 'bleu')
    assert [r['seed'] for r in recipe_runs] == [0, 1]
    report = {'metric': 'bleu', 'test_split': 'test', 'recipes': {}}
    report['recipes']['a'] = sweep_report.recipe_report('c.py', [], None, recipe_runs, {})
    assert sweep_report.table(report)[2:] == [
        '| a | 0 | 20 (deadline) | 41.25 | 12.5 | - | - | - |',
        '| a | 1 | - (deadline) | 41.25 | 12.5 | - | - | - |',
    ]


def test_summary_is_the_sample_mean_and_std():
    s = sweep_jobs.summary([40.0, 41.0, 42.5])
    assert s['n'] == 3 and s['mean'] == pytest.approx(41.1666667)
    assert s['std'] == pytest.approx(1.2583057)  # ddof=1: sqrt(((-7/6)^2 + ...) / 2)
    assert sweep_jobs.mean_std(s) == '41.17 +- 1.26 (n=3)'
    assert sweep_jobs.summary([40.0])['std'] is None
    assert sweep_jobs.mean_std(sweep_jobs.summary([40.0])) == '40.00 (n=1)'


_FORKS = []  # one entry per os.fork-style fork of this process (jax warns at each one)
os.register_at_fork(before=lambda: _FORKS.append(1))


def test_jobs_still_running_at_the_stop_time_get_sigint(tmp_path):
    """A job that ends by itself is not stopped; one still running at the stop time gets
    SIGINT (Python: KeyboardInterrupt, then death by SIGINT), even from a sweep that ignores SIGINT,
    and is marked stopped. The jobs start without a fork that runs Python in the child (a
    deadlock risk beside jax's threads)."""
    forks = len(_FORKS)
    quick = [sys.executable, '-c', 'print("done")']
    slow = [sys.executable, '-c', 'import time; time.sleep(60)']
    jobs = {
        'quick': sweep_jobs.Job(quick, tmp_path / 'quick.log'),
        'slow': sweep_jobs.Job(slow, tmp_path / 'slow.log'),
    }
    start = time.time()
    # As a sweep started in the background (`nohup ... &`) is: SIGINT ignored, which the jobs
    # must not inherit.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        done = sweep_jobs.run_all(
            jobs, cwd=tmp_path, env={}, stop_at=start + 3, grace_s=5, poll_s=0.1
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done['quick'] == (0, done['quick'].seconds, False)
    assert done['slow'].stopped and 3 <= done['slow'].seconds < 8 and time.time() - start < 10
    # SIGINT reached the job and ended it: Python ends on an unhandled KeyboardInterrupt by
    # SIGINT itself, as does a job that had not yet installed Python's handler (a loaded host).
    assert done['slow'].returncode == -signal.SIGINT
    assert len(_FORKS) == forks


def test_a_stop_time_already_past_stops_jobs_that_are_still_starting(tmp_path):
    """The SIGINT goes out right after the jobs start, while each is still in the small Python
    that restores SIGINT's default: from a sweep that ignores SIGINT it would be lost there
    (the job then ran until SIGKILL at the end of the grace time); it is kept and ends them."""
    slow = [sys.executable, '-c', 'import time; time.sleep(60)']
    jobs = {i: sweep_jobs.Job(slow, tmp_path / f'{i}.log') for i in range(3)}
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        done = sweep_jobs.run_all(
            jobs, cwd=tmp_path, env={}, stop_at=time.time() - 1, grace_s=30, poll_s=0.05
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert all(d.stopped and d.returncode == -signal.SIGINT for d in done.values()), done
    assert max(d.seconds for d in done.values()) < 15  # well before the SIGKILL at 30 s


def test_a_lost_sigint_is_sent_again_before_the_kill(tmp_path):
    """A job that loses the first KeyboardInterrupt (as one raised inside a garbage-collection
    callback is lost) gets a second SIGINT half the grace time later, before SIGKILL."""
    deaf_once = (
        'import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    pass\ntime.sleep(60)'
    )
    jobs = {'job': sweep_jobs.Job([sys.executable, '-c', deaf_once], tmp_path / 'job.log')}
    start = time.time()
    done = sweep_jobs.run_all(jobs, cwd=tmp_path, env={}, stop_at=start + 2, grace_s=6, poll_s=0.1)
    assert done['job'].stopped and done['job'].returncode == -signal.SIGINT, done
    assert 5 <= done['job'].seconds < 6  # the second SIGINT at 2 + 3 s, no SIGKILL at 2 + 6 s


def test_training_speed_reads_the_runs_own_logs(tmp_path):
    log = tmp_path / 'seed0.log'
    log.write_text(
        'I1126 parallel.py:333] Compiled the training step in 12.5 s.\n'
        'I1126 metrics.py:224] step 50/8000  loss 5.1  lr 1e-3  2.00 steps/s\n'
    )
    records = [
        {'step': 50 * i, 'split': 'train', 'steps_per_s': v} for i, v in enumerate([1, 8, 9, 10])
    ]
    records.insert(1, {'step': 50, 'split': 'validation', 'loss': 3.0})
    (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    speed = sweep_jobs.training_speed(log, tmp_path)
    # The first interval holds the compilation: the median of the others.
    assert speed == {'compile_s': 12.5, 'steps_per_s': 9, 'planned_steps': 8000}


def _sweep_args(out) -> list[str]:
    settings = [f'--set={key}={value}' for key, value in SMALL.items()]
    # 30 updates at a constant 0.01: enough for outputs that score above 0 and differ by seed.
    settings += [f'--set=train.{k}' for k in ('num_steps=30', 'checkpoint_every=15', 'log_every=5')]
    settings += ['--set=opt.schedule=constant', '--set=opt.lr_scale=0.01']
    return (
        [f'--out={out}', '--recipe=a=configs/tiny.py', '--seeds', '3', '5', *settings]
        + ['--beam_size=2', '--length_penalty', 'gnmt', 'fairseq', '--max_examples=4']
        + ['--metric=chrf']  # BLEU is still 0 for both seeds, chrF is not
    )


@pytest.fixture(scope='module')
def two_seeds(tmp_path_factory):
    """A sweep of 1 recipe x 2 seeds trained side by side: (its OUT, its report)."""
    out = tmp_path_factory.mktemp('sweep')
    return out, multi30k_sweep.main(_sweep_args(out))


@pytest.mark.slow
@pytest.mark.long
def test_two_seeds_train_side_by_side_and_the_table_holds_their_mean_and_std(two_seeds):
    tmp_path, report = two_seeds
    recipe = report['recipes']['a']
    assert [r['seed'] for r in recipe['runs']] == [3, 5]
    for run in recipe['runs']:
        assert run['updates'] == 30 and run['planned_steps'] == 30
        assert run['compile_s'] > 0 and run['steps_per_s'] > 0 and 0 < run['test'] <= 100
        assert (tmp_path / 'a' / f'seed{run["seed"]}' / 'checkpoints').is_dir()
    # The choice has the best mean validation score of the 2 settings both seeds scored.
    rows = list(recipe['validation_rows'].values())
    assert len(rows) == 2 and all(len(r) == 2 for r in rows)
    means = [(a['chrf'] + b['chrf']) / 2 for a, b in zip(*rows, strict=True)]
    best = rows[0][means.index(max(means))]
    assert recipe['choice'] == {k: best[k] for k in sweep_report.SETTING}
    for part in ('validation', 'test'):
        values = [run[part] for run in recipe['runs']]
        assert recipe[part]['values'] == values and recipe[part]['n'] == 2
        assert recipe[part]['mean'] == pytest.approx(statistics.mean(values))
        assert recipe[part]['std'] == pytest.approx(statistics.stdev(values))
    table = (tmp_path / 'sweep.md').read_text()
    assert recipe['validation']['std'] > 0  # the seeds differ: the check above can fail
    assert sweep_jobs.mean_std(recipe['test']) in table and report['test_split'] == 'test'
    assert json.loads((tmp_path / 'sweep.json').read_text()) == json.loads(json.dumps(report))


@pytest.mark.slow
@pytest.mark.long
def test_a_rerun_reads_partial_rows_and_tests_a_setting_every_seed_finished(two_seeds, capsys):
    """Seed 3's validation JSON holds 3 settings (a third, with the best score of all, as an
    earlier sweep of a larger grid would leave it), seed 5's the 2 it finished before a stop.
    The rerun keeps every row (nothing is scored again), chooses a setting both seeds have,
    scores the test split with it and prints the table."""
    out, first = two_seeds
    seed3, seed5 = (out / 'a' / f'seed{s}.validation.json' for s in (3, 5))
    table = json.loads(seed3.read_text())
    table['rows'].append(table['rows'][0] | {'beam_size': 3, 'chrf': 100.0})
    seed3.write_text(json.dumps(table))
    table = json.loads(seed5.read_text())
    seed5.write_text(json.dumps(table | {'stopped': 'stopped after 2 of 3 settings: test'}))
    (out / 'a' / 'seed5.test.json').unlink()
    report = multi30k_sweep.main(_sweep_args(out))
    recipe = report['recipes']['a']
    assert [len(recipe['validation_rows'][s]) for s in (3, 5)] == [3, 2]
    assert recipe['choice'] == first['recipes']['a']['choice']  # not the third setting
    assert recipe['test']['n'] == 2 and recipe['test'] == first['recipes']['a']['test']
    assert sweep_jobs.mean_std(recipe['test']) in capsys.readouterr().out
    assert (out / 'a' / 'seed5.test.json').exists()


def test_a_missing_config_and_a_repeated_seed_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match='no config file configs/nope.py'):
        multi30k_sweep.main([f'--out={tmp_path}', '--recipe=c=configs/nope.py'])
    with pytest.raises(SystemExit):
        multi30k_sweep.main(
            [f'--out={tmp_path}', '--recipe=c=configs/tiny.py', '--seeds', '1', '1']
        )
