"""benchmarks/multi30k_sweep.py and its helpers (benchmarks/sweep_jobs.py): seeds trained side
by side, one decoding choice per recipe on the mean validation BLEU, the test split scored
once per seed, mean +- std; on CPU with tiny settings."""

import json
import statistics
import sys
import time

import pytest

from benchmarks import multi30k_sweep, sweep_jobs
from tests.tiny_run import SMALL


def test_the_choice_is_the_best_mean_over_seeds_not_one_seeds_best():
    """Seed 0 alone would pick beam 1; the mean over both seeds picks beam 2."""
    setting = {'average_last': 1, 'alpha': 0.6, 'length_penalty': 'gnmt'}
    seed0 = [setting | {'beam_size': 1, 'bleu': 30.0}, setting | {'beam_size': 2, 'bleu': 29.0}]
    seed1 = [setting | {'beam_size': 1, 'bleu': 20.0}, setting | {'beam_size': 2, 'bleu': 25.0}]
    choice, mean = multi30k_sweep._choose([seed0, seed1], 'bleu')
    assert choice == setting | {'beam_size': 2} and mean == 27.0


def test_summary_is_the_sample_mean_and_std():
    s = sweep_jobs.summary([40.0, 41.0, 42.5])
    assert s['n'] == 3 and s['mean'] == pytest.approx(41.1666667)
    assert s['std'] == pytest.approx(1.2583057)  # ddof=1: sqrt(((-7/6)^2 + ...) / 2)
    assert sweep_jobs.mean_std(s) == '41.17 +- 1.26 (n=3)'
    assert sweep_jobs.summary([40.0])['std'] is None
    assert sweep_jobs.mean_std(sweep_jobs.summary([40.0])) == '40.00 (n=1)'


def test_jobs_still_running_at_the_stop_time_get_sigint(tmp_path):
    """A job that ends by itself is not stopped; one still running at the stop time gets
    SIGINT (Python: KeyboardInterrupt, exit code 1) and is marked stopped."""
    quick = [sys.executable, '-c', 'print("done")']
    slow = [sys.executable, '-c', 'import time; time.sleep(60)']
    jobs = {
        'quick': sweep_jobs.Job(quick, tmp_path / 'quick.log'),
        'slow': sweep_jobs.Job(slow, tmp_path / 'slow.log'),
    }
    start = time.time()
    done = sweep_jobs.run_all(jobs, cwd=tmp_path, env={}, stop_at=start + 3, grace_s=5, poll_s=0.1)
    assert done['quick'] == (0, done['quick'].seconds, False)
    assert done['slow'].stopped and done['slow'].returncode != 0
    assert 3 <= done['slow'].seconds < 8 and time.time() - start < 10
    assert 'KeyboardInterrupt' in (tmp_path / 'slow.log').read_text()


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


@pytest.mark.slow
def test_two_seeds_train_side_by_side_and_the_table_holds_their_mean_and_std(tmp_path):
    settings = [f'--set={key}={value}' for key, value in SMALL.items()]
    # 30 updates at a constant 0.01: enough for outputs that score above 0 and differ by seed.
    settings += [f'--set=train.{k}' for k in ('num_steps=30', 'checkpoint_every=15', 'log_every=5')]
    settings += ['--set=opt.schedule=constant', '--set=opt.lr_scale=0.01']
    report = multi30k_sweep.main(
        [f'--out={tmp_path}', '--recipe=a=configs/tiny.py', '--seeds', '3', '5', *settings]
        + ['--beam_size=2', '--length_penalty', 'gnmt', 'fairseq', '--max_examples=4']
        + ['--metric=chrf']  # BLEU is still 0 for both seeds, chrF is not
    )
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
    assert recipe['choice'] == {k: best[k] for k in multi30k_sweep.SETTING}
    for part in ('validation', 'test'):
        values = [run[part] for run in recipe['runs']]
        assert recipe[part]['values'] == values and recipe[part]['n'] == 2
        assert recipe[part]['mean'] == pytest.approx(statistics.mean(values))
        assert recipe[part]['std'] == pytest.approx(statistics.stdev(values))
    table = (tmp_path / 'sweep.md').read_text()
    assert recipe['validation']['std'] > 0  # the seeds differ: the check above can fail
    assert sweep_jobs.mean_std(recipe['test']) in table and report['test_split'] == 'test'
    assert json.loads((tmp_path / 'sweep.json').read_text()) == json.loads(json.dumps(report))


def test_a_missing_config_and_a_repeated_seed_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match='no config file configs/nope.py'):
        multi30k_sweep.main([f'--out={tmp_path}', '--recipe=c=configs/nope.py'])
    with pytest.raises(SystemExit):
        multi30k_sweep.main(
            [f'--out={tmp_path}', '--recipe=c=configs/tiny.py', '--seeds', '1', '1']
        )
