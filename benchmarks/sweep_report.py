"""What benchmarks/multi30k_sweep.py reports: one decoding choice per recipe from its seeds'
validation rows, every run's values at that choice, and the markdown table.

A run keeps its row in the table whatever happens after its training (its updates, steps/s and
compile time come from its own logs); the values it lacks are '-', and the notes say why.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import sweep_jobs

SETTING = ('average_last', 'beam_size', 'alpha', 'length_penalty')  # what a choice fixes


def choose(rows_by_seed: dict[int, list[dict]], metric: str) -> tuple[dict, float, list[int]]:
    """The setting (`SETTING` keys) with the best mean ``metric`` among those scored by the
    most seeds, that mean, and the seeds of ``rows_by_seed`` without a score at it.

    Every seed scores the grid in the same order, so a seed stopped part-way has scored a
    first part of what the others have: the choice is among the settings every scored seed
    finished, and no seed is left out. Ties go to the setting scored first.
    """
    values: dict[tuple, dict[int, float]] = {}
    for seed, rows in rows_by_seed.items():
        for row in rows:
            values.setdefault(tuple(row[k] for k in SETTING), {})[seed] = row[metric]
    if not values:
        raise ValueError('no validation row to choose from')
    most = max(len(scores) for scores in values.values())
    candidates = [s for s, scores in values.items() if len(scores) == most]
    best = max(candidates, key=lambda s: statistics.mean(values[s].values()))
    left_out = sorted(set(rows_by_seed) - set(values[best]))
    return dict(zip(SETTING, best, strict=True)), statistics.mean(values[best].values()), left_out


def recipe_runs(name, choice, seeds, runs, validation, tests, metric) -> list[dict]:
    """The trained runs of recipe ``name``, each with its validation and test ``metric`` at
    ``choice`` (None: not scored, or no choice); ``updates`` is the step its values are at
    (without a validation row: its newest checkpoint)."""
    recipe_runs = []
    for seed in seeds:
        if (name, seed) not in runs:
            continue  # its training failed; a note says so
        run = dict(runs[name, seed])
        rows = validation.get((name, seed), []) if choice else []
        row = next((r for r in rows if all(r[k] == choice[k] for k in SETTING)), None)
        if row is not None:
            run['updates'] = row['steps'][-1]
        test = tests.get((name, seed))
        run['validation'] = row[metric] if row is not None else None
        run['test'] = test[metric] if test else None
        recipe_runs.append(run)
    return recipe_runs


def recipe_report(config, flags, choice, runs: list[dict], rows: dict) -> dict[str, Any]:
    """A recipe's entry of the sweep's JSON: its choice, runs and mean +- std of each split."""
    return {
        'config': config,
        'flags': flags,
        'choice': choice,
        'runs': runs,
        'validation': sweep_jobs.summary(
            [r['validation'] for r in runs if r['validation'] is not None]
        ),
        'test': sweep_jobs.summary([r['test'] for r in runs if r['test'] is not None]),
        'validation_rows': rows,
    }


def table(report: dict) -> list[str]:
    """The markdown table: a row per trained run, then per chosen recipe its mean +- std."""
    metric, split = report['metric'], report['test_split']
    header = ('recipe', 'seed', 'updates', 'steps/s', 'compile s', 'choice')
    header += (f'validation {metric}', f'{split} {metric}')
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]

    def number(x, digits=2):
        return '-' if x is None else f'{x:.{digits}f}'

    for name, recipe in report['recipes'].items():
        c, choice = recipe['choice'], '-'
        if c:
            choice = f'avg {c["average_last"]}, beam {c["beam_size"]}, alpha {c["alpha"]}, '
            choice += c['length_penalty']
        for run in recipe['runs']:
            updates = '-' if run['updates'] is None else f'{run["updates"]}'
            updates += ' (deadline)' if run['stopped_at_deadline'] else ''
            lines.append(
                f'| {name} | {run["seed"]} | {updates} | {number(run["steps_per_s"])} '
                f'| {number(run["compile_s"], 1)} | {choice} | {number(run["validation"])} '
                f'| {number(run["test"])} |'
            )
        if c:
            means = [sweep_jobs.mean_std(recipe[part]) for part in ('validation', 'test')]
            lines.append(f'| {name} | mean +- std | | | | {choice} | {means[0]} | {means[1]} |')
    return lines
