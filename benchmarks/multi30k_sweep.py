r"""Several recipes trained side by side on one machine, then each scored on validation.

  python benchmarks/multi30k_sweep.py --out runs/sweep \
      --recipe tiny=configs/multi30k.py:tiny \
      --recipe d03=configs/multi30k.py:dropout02,--config.model.dropout_rate=0.3 \
      --set data.manual_dir=../shared/data/multi30k --set train.num_steps=12000 \
      --average_last 1 10 --beam_size 5 --alpha 0.6 1.0 1.4

Each recipe (``NAME=CONFIG[,--config.KEY=VALUE,...]``) trains in its own ``python train.py``
process, all at once, in OUT/NAME (its console in OUT/NAME.log); on a GPU each process gets an
equal share of its memory (``XLA_PYTHON_CLIENT_MEM_FRACTION`` = 0.9 / recipes, unless set).
``--set KEY=VALUE`` applies to every recipe. Then each finished run is scored on its
validation split in a process of its own (benchmarks/eval_sweep.py: every averaging, beam size
and alpha; never the test split), and one table of all of them is printed and saved as
OUT/sweep.json and OUT/sweep.md. A run directory that already holds a finished run trains
nothing again, so a sweep can be rerun to add settings.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', required=True, help='directory of the runs and the table')
    parser.add_argument(
        '--recipe', action='append', required=True, help='NAME=CONFIG[,--config.KEY=VALUE,...]'
    )
    parser.add_argument('--set', action='append', default=[], help='KEY=VALUE for every recipe')
    parser.add_argument('--average_last', type=int, nargs='+', default=[1])
    parser.add_argument('--beam_size', type=int, nargs='+', default=[4])
    parser.add_argument('--alpha', type=float, nargs='+', default=[0.6])
    parser.add_argument('--max_examples', type=int, default=0, help='first N sentences; 0 = all')
    return parser.parse_args(argv)


def _recipes(specs: list[str]) -> dict[str, tuple[str, list[str]]]:
    """NAME -> (config path, its own flags); one-line errors for what cannot run."""
    recipes = {}
    for spec in specs:
        name, _, rest = spec.partition('=')
        config, *flags = rest.split(',')
        if not name or not config or name in recipes:
            raise SystemExit(f'error: --recipe {spec!r}: want a new NAME=CONFIG[,FLAG,...].')
        if not (REPO / config).is_file() and not os.path.isfile(config):
            raise SystemExit(f'error: --recipe {name}: no config file {config}.')
        recipes[name] = (config, flags)
    return recipes


def _train(recipes, common: list[str], out: pathlib.Path) -> dict[str, float]:
    """Trains every recipe at once; returns each one's wall time in seconds."""
    env = dict(os.environ)
    env.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', f'{0.9 / len(recipes):.2f}')
    procs, logs, start = {}, [], time.time()
    for name, (config, flags) in recipes.items():
        cmd = [sys.executable, 'train.py', f'--config={config}', f'--workdir={out / name}']
        cmd += [*common, *flags]
        log = open(out / f'{name}.log', 'w')  # noqa: SIM115 - closed below
        logs.append(log)
        procs[name] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
    seconds = {}
    try:
        for name, proc in procs.items():
            proc.wait()
            seconds[name] = time.time() - start
    finally:
        for proc in procs.values():
            proc.kill()
        for log in logs:
            log.close()
    failed = [name for name, proc in procs.items() if proc.returncode]
    if failed:
        last = (out / f'{failed[0]}.log').read_text().strip().splitlines()[-1:]
        raise SystemExit(f'error: recipe {failed[0]} failed ({last}); see {out}/{failed[0]}.log')
    return seconds


def _score(name: str, workdir: pathlib.Path, args: argparse.Namespace) -> list[dict]:
    """Every decoding setting of one run on its validation split, in a process of its own."""
    table = workdir.parent / f'{name}.validation.json'
    cmd = [sys.executable, 'benchmarks/eval_sweep.py', f'--workdir={workdir}', f'--out={table}']
    cmd += ['--average_last', *map(str, args.average_last), '--beam_size']
    cmd += [*map(str, args.beam_size), '--alpha', *map(str, args.alpha)]
    cmd += [f'--max_examples={args.max_examples}']
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f'error: scoring {name}: {done.stderr.strip().splitlines()[-1:]}')
    return json.loads(table.read_text())['rows']


def main(argv: list[str] | None = None) -> list[dict]:
    args = _parse_args(argv)
    recipes = _recipes(args.recipe)
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = [f'--config.{setting}' for setting in args.set]
    print(f'Training {len(recipes)} recipes side by side in {out} ...', flush=True)
    seconds = _train(recipes, common, out)
    rows = []
    for name, (config, flags) in recipes.items():
        final = json.loads((out / name / 'final_metrics.json').read_text())
        for row in _score(name, out / name, args):
            rows.append(
                {'recipe': name, 'config': config, 'flags': [*common, *flags]}
                | {'updates': final['step'], 'train_s': round(seconds[name], 1)}
                | row
            )
    header = ('recipe', 'updates', 'train s', 'averaged', 'beam', 'alpha', 'tokenized BLEU')
    header += ('sacreBLEU', 'chrF')
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for r in rows:
        lines.append(
            f'| {r["recipe"]} | {r["updates"]} | {r["train_s"]} | {r["average_last"]} '
            f'| {r["beam_size"]} | {r["alpha"]} | {r["tokenized_bleu"]:.2f} '
            f'| {r["sacrebleu"]:.2f} | {r["chrf"]:.2f} |'
        )
    (out / 'sweep.md').write_text('\n'.join(lines) + '\n')
    (out / 'sweep.json').write_text(json.dumps({'rows': rows}, indent=2))
    print('\n'.join(lines))
    return rows


if __name__ == '__main__':
    main()
