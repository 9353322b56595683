r"""Recipes x seeds trained side by side on one machine; one decoding choice per recipe, made on
its seeds' mean validation BLEU; the test split scored once per seed with it.

  python benchmarks/multi30k_sweep.py --out runs/sweep --seeds 0 1 2 \
      --recipe tiny=configs/multi30k.py:tiny \
      --recipe tiny_fairseq=configs/multi30k.py:tiny_fairseq \
      --set data.manual_dir=../shared/data/multi30k \
      --average_last 1 10 --beam_size 5 --alpha 0.6 1.0 1.4 --length_penalty gnmt fairseq \
      --deadline_s 3600

Each recipe (``NAME=CONFIG[,--config.KEY=VALUE,...]``) trains once per seed
(``--config.train.seed=S``), every run in its own ``python train.py`` process and all at once,
in OUT/NAME/seedS (its console appended to OUT/NAME/seedS.log); ``--set KEY=VALUE`` applies to
every run. On a GPU each process of a stage gets an equal share of its memory
(``XLA_PYTHON_CLIENT_MEM_FRACTION`` = 0.9 / processes, unless set). A run directory that
already holds a finished run trains nothing again, so a sweep can be rerun to add settings.

Then, each in a process of its own and all at once:

1. Validation: benchmarks/eval_sweep.py scores every run on its validation split with every
   setting of the grid (checkpoints averaged x beam x alpha x length penalty rule; the rule
   defaults to each recipe's ``eval.length_penalty``), saving its rows (OUT/NAME/seedS
   .validation.json) after each; a rerun keeps the rows scored at the same step and skips them.
2. The choice: per recipe, the setting with the best mean ``--metric`` (tokenized BLEU: the
   run's convention, lowercased for Multi30k) among the settings every scored seed finished
   (`sweep_report.choose`; the notes name a seed left out). Test scores never take part in it.
3. Test: ``transformer.evaluate`` scores the config's test split (test2016 for Multi30k) once
   per trained run of a recipe with a choice (hypotheses and scores in OUT/NAME/seedS.test.txt
   / .json).

One table, printed and saved as OUT/sweep.md (with OUT/sweep.json): per trained run its
updates, steps/s and training-step compile time as its own logs give them
(`sweep_jobs.training_speed`), whatever happens after its training, its validation and test
values at the recipe's choice ('-' where there is none), then per recipe with a choice the
mean +- sample standard deviation (ddof=1) over its seeds, with n; the notes under it say which
stage stopped which run, by which stop time, after how many settings. The exit code is 1 when
no run was scored on validation.

The time plan (printed first). ``--deadline_s`` D bounds the whole sweep (from its start;
``--reserve_s`` R, default D / 4):

- Training: runs still going at D - R get SIGINT (train.py saves the checkpoint in flight and
  exits) and are scored at their last checkpoint; the table marks them "(deadline)". One still
  running ``--grace_s`` / 2 later gets a second SIGINT, and SIGKILL at ``--grace_s``.
- Validation: each run's eval_sweep starts its next setting only if it is predicted to end by
  the validation stop time D - R / 3 and to leave one test evaluate before D:

      now + later <= D - R / 3   and   now + later + first <= D

  where first is the run's own time from its launch to the end of its first setting (start-up,
  loading, compiling, decoding: what the test stage's new process costs) and later
  the longest of its later settings so far (first before a second). So a stage that cannot
  finish its grid in time scores the grid's first settings (average outermost, then beam,
  alpha, rule) and starts no setting it cannot end; a first setting still running at D - R / 3
  gets SIGINT (its run keeps no validation score).
- Test: whatever is left, planned as the slowest run's first; processes still running at D get
  SIGINT and their runs no test value (n says how many seeds a mean is over).

So after the trainings a grid of S settings needs about first + (S - 1) x later to validate
and first to test (runs side by side take as long as the slowest): choose R >= 2 x first +
(S - 1) x later, with first and later as a run measured them (its validation rows'
``seconds``: the first row's hold the compilation; benchmarks/README.md has measured ones).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import sweep_jobs, sweep_report  # noqa: E402
from benchmarks.sweep_jobs import Job  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
METRICS = ('tokenized_bleu', 'sacrebleu', 'chrf')


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', required=True, help='directory of the runs and the table')
    parser.add_argument(
        '--recipe', action='append', required=True, help='NAME=CONFIG[,--config.KEY=VALUE,...]'
    )
    parser.add_argument('--set', action='append', default=[], help='KEY=VALUE for every run')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0], help='train.seed of each')
    parser.add_argument('--average_last', type=int, nargs='+', default=[1])
    parser.add_argument('--beam_size', type=int, nargs='+', default=[4])
    parser.add_argument('--alpha', type=float, nargs='+', default=[0.6])
    parser.add_argument(
        '--length_penalty',
        nargs='+',
        choices=('gnmt', 'fairseq'),
        default=None,
        help="'gnmt' and/or 'fairseq' (default: each recipe's eval.length_penalty)",
    )
    parser.add_argument('--metric', choices=METRICS, default='tokenized_bleu')
    parser.add_argument('--max_examples', type=int, default=0, help='first N sentences; 0 = all')
    parser.add_argument('--deadline_s', type=float, default=0, help='whole sweep; 0 = none')
    parser.add_argument(
        '--reserve_s',
        type=float,
        default=None,
        help='kept for scoring before the deadline (default: a quarter of --deadline_s)',
    )
    parser.add_argument(
        '--grace_s',
        type=float,
        default=60.0,
        help='seconds a training stopped at D - R has to save and exit before SIGKILL',
    )
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f'--seeds {args.seeds} repeats a seed; give each once.')
    if min(args.deadline_s, args.reserve_s or 0, args.grace_s) < 0:
        parser.error('--deadline_s, --reserve_s and --grace_s must be >= 0.')
    if args.reserve_s is None:
        args.reserve_s = args.deadline_s / 4
    return args


def _recipes(specs: list[str]) -> dict[str, tuple[str, list[str]]]:
    """NAME -> (config path, its own flags); one-line errors for what cannot run."""
    recipes = {}
    for spec in specs:
        name, _, rest = spec.partition('=')
        config, *flags = rest.split(',')
        if not name or not config or name in recipes or '/' in name:
            raise SystemExit(f'error: --recipe {spec!r}: want a new NAME=CONFIG[,FLAG,...].')
        path = config.partition(':')[0]
        if not (REPO / path).is_file() and not os.path.isfile(path):
            raise SystemExit(f'error: --recipe {name}: no config file {path}.')
        recipes[name] = (config, flags)
    return recipes


def _train(args, recipes, common, out: pathlib.Path, stop_at: float) -> dict:
    """Every recipe x seed at once: ({(name, seed): run record}, a note for each failed run)."""
    jobs = {}
    for name, (config, flags) in recipes.items():
        for seed in args.seeds:
            workdir = out / name / f'seed{seed}'
            workdir.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, 'train.py', f'--config={config}', f'--workdir={workdir}']
            cmd += [*common, *flags, f'--config.train.seed={seed}']
            jobs[name, seed] = Job(cmd, workdir.parent / f'seed{seed}.log')
    env = sweep_jobs.memory_fraction(len(jobs), dict(os.environ))
    done = sweep_jobs.run_all(jobs, cwd=REPO, env=env, stop_at=stop_at, grace_s=args.grace_s)
    runs, failed, notes = {}, [], []
    for (name, seed), result in done.items():
        job, workdir = jobs[name, seed], out / name / f'seed{seed}'
        speed = sweep_jobs.training_speed(job.log, workdir)
        if result.returncode and not result.stopped:
            failed.append(f'{name} seed {seed}: training failed ({sweep_jobs.last_line(job.log)})')
            print(failed[-1])
            continue
        runs[name, seed] = {
            'recipe': name,
            'seed': seed,
            'workdir': str(workdir),
            'train_s': round(result.seconds, 1),
            'stopped_at_deadline': result.stopped,
            'updates': sweep_jobs.last_checkpoint(workdir),
        } | speed
        if result.stopped:
            notes.append(
                f'{name} seed {seed}: training stopped at its stop time (D - R), newest '
                f'checkpoint {runs[name, seed]["updates"]} of {speed["planned_steps"]} updates'
            )
    return runs, failed + notes


def _plan(args, start: float) -> dict[str, float]:
    """The stop times of the stages (`time.time()`), printed as seconds from the start."""
    deadline = start + args.deadline_s if args.deadline_s else math.inf
    plan = {'train': deadline - args.reserve_s, 'validation': deadline - args.reserve_s / 3}
    plan['test'] = deadline
    if math.isinf(deadline):
        print('Time plan: no deadline (--deadline_s 0): every stage runs to its end.')
    else:
        at = {stage: f'{t - start:.0f} s' for stage, t in plan.items()}
        print(
            f'Time plan (D = {args.deadline_s:.0f} s, R = {args.reserve_s:.0f} s): trainings '
            f'stopped at D - R = {at["train"]}; a validation setting starts only if predicted '
            f'to end by D - R / 3 = {at["validation"]} and to leave a test evaluate before D; '
            f'tests stopped at D = {at["test"]}.'
        )
    return plan


def _validation_file(run: dict) -> pathlib.Path:
    return pathlib.Path(run['workdir']).with_suffix('.validation.json')


def _validate(args, runs: dict, plan: dict) -> tuple[dict, list[str]]:
    """({(name, seed): eval_sweep rows} of the runs scored on their validation split, as each
    JSON holds them however its process ended; notes on each run that was cut or failed)."""
    jobs, launched = {}, time.time()
    for key, run in runs.items():
        table = _validation_file(run)
        cmd = [sys.executable, 'benchmarks/eval_sweep.py', f'--workdir={run["workdir"]}']
        cmd += [f'--out={table}', f'--max_examples={args.max_examples}', '--average_last']
        cmd += [*map(str, args.average_last), '--beam_size', *map(str, args.beam_size)]
        cmd += ['--alpha', *map(str, args.alpha)]
        cmd += ['--length_penalty', *args.length_penalty] if args.length_penalty else []
        if not math.isinf(plan['test']):
            cmd += [f'--stop_at={plan["validation"]}', f'--test_deadline={plan["test"]}']
        jobs[key] = Job(cmd + [f'--started_at={launched}'], table.with_suffix('.log'))
    env = sweep_jobs.memory_fraction(len(jobs), dict(os.environ))
    done = sweep_jobs.run_all(jobs, cwd=REPO, env=env, stop_at=plan['validation'], grace_s=10)
    rows, notes, firsts = {}, [], []
    for (name, seed), job in jobs.items():
        try:
            table = json.loads(_validation_file(runs[name, seed]).read_text())
        except (OSError, ValueError):
            table = {'rows': [], 'stopped': None}
        where, result = f'{name} seed {seed}: validation', done[name, seed]
        if table['rows']:
            rows[name, seed] = table['rows']
        if table.get('first_s'):
            firsts.append(table['first_s'])
        if result.stopped:
            settings = table['stopped'] or 'stopped before its first setting ended'
            notes.append(f'{where} {settings}, by the validation stop time (D - R / 3)')
        elif table['stopped']:
            notes.append(f'{where} {table["stopped"]}')
        elif result.returncode:
            notes.append(f'{where} failed ({sweep_jobs.last_line(job.log)})')
        if not table['rows']:
            notes.append(f'{name} seed {seed}: no validation score')
    for note in notes:
        print(note)
    print(_test_plan(rows, firsts, plan))
    return rows, notes


def _test_plan(rows: dict, firsts: list[float], plan: dict) -> str:
    """What validation measured and what it predicts of the test stage, in one line: first,
    a process's launch to the end of its first setting; later, a further setting's seconds."""
    laters = [x['seconds'] for r in rows.values() for x in r[1:]]
    if not firsts:
        return 'Validation scored no setting in this sweep.'
    line = f'Validation measured a first setting (from launch) of up to {max(firsts):.0f} s'
    line += f', a later one of up to {max(laters):.0f} s' if laters else ''
    left = plan['test'] - time.time()
    if math.isinf(left):
        return line + '.'
    return line + f'; the test stage is planned at ~{max(firsts):.0f} s, {left:.0f} s left.'


def _test(args, runs: dict, choices: dict, plan: dict) -> tuple[dict, list[str]]:
    """({(name, seed): the evaluate command's scores} of the test split, once per trained run
    of a recipe with a choice; notes on each run without one)."""
    jobs, outputs = {}, {}
    for key, run in runs.items():
        if key[0] not in choices:
            continue
        c = choices[key[0]]
        outputs[key] = output = pathlib.Path(run['workdir']).with_suffix('.test.txt')
        output.with_suffix('.json').unlink(missing_ok=True)
        cmd = [sys.executable, '-m', 'transformer.evaluate', f'--workdir={run["workdir"]}']
        cmd += [f'--average_last={c["average_last"]}', f'--beam_size={c["beam_size"]}']
        cmd += [f'--alpha={c["alpha"]}', f'--length_penalty={c["length_penalty"]}']
        cmd += [f'--max_examples={args.max_examples}', f'--output={output}']
        jobs[key] = Job(cmd, output.with_suffix('.log'))
    env = sweep_jobs.memory_fraction(len(jobs), dict(os.environ))
    done = sweep_jobs.run_all(jobs, cwd=REPO, env=env, stop_at=plan['test'], grace_s=10)
    scores, notes = {}, []
    for key, output in outputs.items():
        if output.with_suffix('.json').exists():
            scores[key] = json.loads(output.with_suffix('.json').read_text())
        elif done[key].stopped:
            notes.append(f'{key[0]} seed {key[1]}: no test score, stopped by the deadline (D)')
        else:
            last = sweep_jobs.last_line(jobs[key].log)
            notes.append(f'{key[0]} seed {key[1]}: no test score ({last})')
    for note in notes:
        print(note)
    return scores, notes


def _choices(args, recipes: dict, validation: dict) -> tuple[dict, list[str]]:
    """{recipe: its choice} of the recipes with a validation score; notes on the others and
    on the seeds left out of a choice."""
    choices, notes = {}, []
    for name in recipes:
        scored = {seed: rows for (recipe, seed), rows in validation.items() if recipe == name}
        if not scored:
            notes.append(f'{name}: no choice, no run was scored on validation')
            continue
        choices[name], mean, left_out = sweep_report.choose(scored, args.metric)
        unscored = sorted(set(args.seeds) - set(scored))
        print(
            f'{name}: chose {choices[name]} (mean validation {args.metric} {mean:.2f} over '
            f'seeds {sorted(set(scored) - set(left_out))})'
        )
        if left_out or unscored:
            notes.append(
                f'{name}: the choice leaves out seeds {left_out + unscored} (no validation '
                'score at it)'
            )
    return choices, notes


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    recipes = _recipes(args.recipe)
    start = time.time()
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = [f'--config.{setting}' for setting in args.set]
    plan = _plan(args, start)
    print(f'Training {len(recipes)} recipes x {len(args.seeds)} seeds at once in {out} ...')
    runs, notes = _train(args, recipes, common, out, plan['train'])
    validation, validation_notes = _validate(args, runs, plan)
    choices, choice_notes = _choices(args, recipes, validation)
    tests, test_notes = _test(args, runs, choices, plan)
    notes += validation_notes + choice_notes + test_notes
    report = {'metric': args.metric, 'test_split': 'test', 'seeds': args.seeds, 'recipes': {}}
    report['stop_times_s'] = {stage: round(t - start, 1) for stage, t in plan.items()}
    for name, (config, flags) in recipes.items():
        choice = choices.get(name)
        recipe_runs = sweep_report.recipe_runs(
            name, choice, args.seeds, runs, validation, tests, args.metric
        )
        splits = {test['split'] for key, test in tests.items() if key[0] == name}
        report['test_split'] = splits.pop() if len(splits) == 1 else report['test_split']
        rows = {s: validation[n, s] for n, s in validation if n == name}
        report['recipes'][name] = sweep_report.recipe_report(
            config, [*common, *flags], choice, recipe_runs, rows
        )
    report['notes'], report['wall_s'] = notes, round(time.time() - start, 1)
    lines = sweep_report.table(report) + [''] + [f'- {note}' for note in notes]
    (out / 'sweep.md').write_text('\n'.join(lines) + '\n')
    (out / 'sweep.json').write_text(json.dumps(report, indent=2))
    print('\n'.join(lines))
    return report


if __name__ == '__main__':
    if not any(recipe['choice'] for recipe in main()['recipes'].values()):
        raise SystemExit('error: no run was scored on validation; the notes above say why.')
