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
   defaults to each recipe's ``eval.length_penalty``).
2. The choice: per recipe, the setting with the best mean ``--metric`` (tokenized BLEU: the
   run's convention, lowercased for Multi30k) over the seeds that have it. Test scores never
   take part in it.
3. Test: ``transformer.evaluate`` scores the config's test split (test2016 for Multi30k) once
   per seed with that setting (hypotheses and scores in OUT/NAME/seedS.test.txt / .json).

One table, printed and saved as OUT/sweep.md (with OUT/sweep.json): per run its updates,
steps/s and training-step compile time as its own logs give them (`sweep_jobs.training_speed`),
its validation and test values with the recipe's choice, then per recipe the mean +- sample
standard deviation (ddof=1) over its seeds, with n.

``--deadline_s`` bounds the whole sweep. Trainings still running at deadline - ``--reserve_s``
are stopped (SIGINT: train.py saves the checkpoint in flight and exits) and are scored at their
last checkpoint; the table gives the updates each run reached and the notes name the runs
stopped. Validation processes still running at deadline - reserve / 3 are stopped, and their
runs dropped; test processes still running at the deadline are stopped, and their runs have no
test value (n says how many seeds a mean is over).
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

from benchmarks import sweep_jobs  # noqa: E402
from benchmarks.sweep_jobs import Job  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SETTING = ('average_last', 'beam_size', 'alpha', 'length_penalty')  # what a choice fixes
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
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f'--seeds {args.seeds} repeats a seed; give each once.')
    if args.deadline_s < 0 or (args.reserve_s or 0) < 0:
        parser.error('--deadline_s and --reserve_s must be >= 0.')
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
    done = sweep_jobs.run_all(jobs, cwd=REPO, env=env, stop_at=stop_at)
    runs, failed = {}, []
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
        } | speed
    return runs, failed


def _validate(args, runs: dict, out: pathlib.Path, stop_at: float) -> dict:
    """{(name, seed): eval_sweep rows} of every run on its validation split, all at once."""
    jobs = {}
    for key, run in runs.items():
        table = pathlib.Path(run['workdir']).with_suffix('.validation.json')
        table.unlink(missing_ok=True)
        cmd = [sys.executable, 'benchmarks/eval_sweep.py', f'--workdir={run["workdir"]}']
        cmd += [f'--out={table}', f'--max_examples={args.max_examples}', '--average_last']
        cmd += [*map(str, args.average_last), '--beam_size', *map(str, args.beam_size)]
        cmd += ['--alpha', *map(str, args.alpha)]
        cmd += ['--length_penalty', *args.length_penalty] if args.length_penalty else []
        jobs[key] = Job(cmd, table.with_suffix('.log'))
    env = sweep_jobs.memory_fraction(len(jobs), dict(os.environ))
    sweep_jobs.run_all(jobs, cwd=REPO, env=env, stop_at=stop_at, grace_s=10)
    rows = {}
    for key, job in jobs.items():
        table = pathlib.Path(runs[key]['workdir']).with_suffix('.validation.json')
        if table.exists():
            rows[key] = json.loads(table.read_text())['rows']
        else:
            print(f'{key[0]} seed {key[1]}: no validation scores ({sweep_jobs.last_line(job.log)})')
    return rows


def _choose(rows_by_seed: list[list[dict]], metric: str) -> tuple[dict, float]:
    """The setting (`SETTING` keys) with the best mean ``metric`` over the seeds that scored
    it, and that mean; ties go to the setting listed first."""
    values: dict[tuple, list[float]] = {}
    for rows in rows_by_seed:
        for row in rows:
            values.setdefault(tuple(row[k] for k in SETTING), []).append(row[metric])
    best = max(values, key=lambda s: sum(values[s]) / len(values[s]))
    return dict(zip(SETTING, best, strict=True)), sum(values[best]) / len(values[best])


def _test(args, runs: dict, choices: dict, out: pathlib.Path, stop_at: float) -> dict:
    """{(name, seed): the evaluate command's scores} of the test split, once per run."""
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
    sweep_jobs.run_all(jobs, cwd=REPO, env=env, stop_at=stop_at, grace_s=10)
    scores = {}
    for key, output in outputs.items():
        if output.with_suffix('.json').exists():
            scores[key] = json.loads(output.with_suffix('.json').read_text())
        else:
            print(f'{key[0]} seed {key[1]}: no test score ({sweep_jobs.last_line(jobs[key].log)})')
    return scores


def _recipe_runs(name, choice, args, runs, validation, tests, notes) -> list[dict]:
    """The runs of recipe ``name`` with their values at its ``choice``; what is missing is
    added to ``notes``."""
    recipe_runs = []
    for seed in args.seeds:
        if (name, seed) not in validation:
            notes.append(f'{name} seed {seed}: dropped (no validation scores)')
            continue
        row = next(r for r in validation[name, seed] if all(r[k] == choice[k] for k in SETTING))
        test = tests.get((name, seed))
        if test is None:
            notes.append(f'{name} seed {seed}: no test score')
        run = runs[name, seed] | {'updates': row['steps'][-1], 'validation': row[args.metric]}
        if run['stopped_at_deadline']:
            notes.append(
                f'{name} seed {seed}: stopped at the deadline, scored at update '
                f'{run["updates"]} of {run["planned_steps"]}'
            )
        recipe_runs.append(run | {'test': test[args.metric] if test else None})
    return recipe_runs


def _table(report: dict) -> list[str]:
    metric, split = report['metric'], report['test_split']
    header = ('recipe', 'seed', 'updates', 'steps/s', 'compile s', 'choice')
    header += (f'validation {metric}', f'{split} {metric}')
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]

    def number(x, digits=2):
        return '-' if x is None else f'{x:.{digits}f}'

    for name, recipe in report['recipes'].items():
        c = recipe['choice']
        choice = f'avg {c["average_last"]}, beam {c["beam_size"]}, alpha {c["alpha"]}, '
        choice += c['length_penalty']
        for run in recipe['runs']:
            updates = f'{run["updates"]}' + (' (deadline)' if run['stopped_at_deadline'] else '')
            lines.append(
                f'| {name} | {run["seed"]} | {updates} | {number(run["steps_per_s"])} '
                f'| {number(run["compile_s"], 1)} | {choice} | {number(run["validation"])} '
                f'| {number(run["test"])} |'
            )
        means = [sweep_jobs.mean_std(recipe[part]) for part in ('validation', 'test')]
        lines.append(f'| {name} | mean +- std | | | | {choice} | {means[0]} | {means[1]} |')
    return lines


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    recipes = _recipes(args.recipe)
    start = time.time()
    deadline = start + args.deadline_s if args.deadline_s else math.inf
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = [f'--config.{setting}' for setting in args.set]
    print(f'Training {len(recipes)} recipes x {len(args.seeds)} seeds at once in {out} ...')
    runs, notes = _train(args, recipes, common, out, deadline - args.reserve_s)
    validation = _validate(args, runs, out, deadline - args.reserve_s / 3)
    choices = {}
    for name in recipes:
        scored = [rows for (recipe, _), rows in validation.items() if recipe == name]
        if scored:
            choices[name], mean = _choose(scored, args.metric)
            print(f'{name}: chose {choices[name]} (mean validation {args.metric} {mean:.2f})')
        else:
            notes.append(f'{name}: dropped, no run was scored on validation')
    tests = _test(args, runs, choices, out, deadline)
    report = {'metric': args.metric, 'test_split': 'test', 'seeds': args.seeds, 'recipes': {}}
    for name, choice in choices.items():
        recipe_runs = _recipe_runs(name, choice, args, runs, validation, tests, notes)
        splits = {test['split'] for key, test in tests.items() if key[0] == name}
        report['test_split'] = splits.pop() if len(splits) == 1 else report['test_split']
        report['recipes'][name] = {
            'config': recipes[name][0],
            'flags': [*common, *recipes[name][1]],
            'choice': choice,
            'runs': recipe_runs,
            'validation': sweep_jobs.summary([r['validation'] for r in recipe_runs]),
            'test': sweep_jobs.summary([r['test'] for r in recipe_runs if r['test'] is not None]),
            'validation_rows': {s: validation[n, s] for n, s in validation if n == name},
        }
    report['notes'], report['wall_s'] = notes, round(time.time() - start, 1)
    lines = _table(report) + [''] + [f'- {note}' for note in notes]
    (out / 'sweep.md').write_text('\n'.join(lines) + '\n')
    (out / 'sweep.json').write_text(json.dumps(report, indent=2))
    print('\n'.join(lines))
    return report


if __name__ == '__main__':
    main()
