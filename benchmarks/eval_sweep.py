r"""Decoding settings of a finished run, scored on the validation split (never the test split).

  python benchmarks/eval_sweep.py --workdir runs/multi30k_dropout03 \
      --average_last 1 5 10 20 --beam_size 4 5 --alpha 0.6 --length_penalty gnmt fairseq \
      --out benchmarks/results/multi30k_dropout03_validation.json

Scores, as the evaluate command does, every combination of checkpoint averaging (the last K
checkpoints, up to ``--step`` if given; each average loaded once), beam size, length penalty
exponent (``--alpha``) and rule (``--length_penalty``: GNMT's ((5 + |y|) / 6)^alpha or
fairseq's |y|^alpha; default the run's ``eval.length_penalty``), on ``--split`` (default: the
config's eval_split), and prints a markdown table of sacreBLEU, tokenized BLEU (the run's
convention) and chrF. Picking settings on the test split would tune to it, so the config's test
split is refused. The last checkpoint is fixed when the sweep starts, so a run that is still
training cannot move it between rows. Hypotheses of each setting go to
WORKDIR/eval/sweep/SPLIT-stepN-avgK-beamB-alphaA-RULE.txt (N: the last checkpoint averaged),
so sweeps up to different steps keep their own files.

``--out FILE`` keeps the table as JSON, rewritten (atomically) after every setting scored, so a
sweep stopped part-way keeps what it finished. A rerun with the same ``--out`` keeps the rows
already scored at the same last step (same split, sentences and ensemble) and skips their
settings. SIGINT (Ctrl-C) stops the sweep: the setting being decoded is dropped, the table of
the others printed and saved with "stopped after k of n settings", exit code 130.

``--stop_at T`` (a Unix time) starts no setting predicted to end after T, and
``--test_deadline D`` none that would leave less than one fresh evaluate of one setting before
D (predicted as the time from ``--started_at``, when the process was launched, to the end of
its first setting: start-up, loading, compiling and decoding once, what scoring the test split
in a new process costs; saved as ``first_s``). A setting is predicted to take as long as the
longest one after the first so far (the first holds the compilation; before a second, the
first's seconds; a row's ``seconds`` include loading its checkpoints when it is the first of
its average). The sweep then stops with "stopped after k of n settings" and the reason, and
exits 0. Settings run in the grid's order (average outermost, then beam, alpha, rule), so those
left are its last ones; none is cut in the middle.

``--ensemble RUN [RUN ...]`` decodes those runs together with ``--workdir`` as one ensemble
(`transformer.evaluate`'s ``--ensemble``), every run loaded at the same steps; its hypotheses
go to ...-ensembleM.txt.
"""

import argparse
import itertools
import json
import os
import signal
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformer import decoding, evaluate, rundir, schema
from transformer.backends import compile_cache
from transformer.checkpoint import checkpoint_steps
from transformer.evaluation import score_eval_set


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', required=True)
    parser.add_argument('--split', default=None, help='default: the config data.eval_split')
    parser.add_argument('--average_last', type=int, nargs='+', default=[1])
    parser.add_argument(
        '--step', type=int, default=None, help='last checkpoint averaged (default: the latest)'
    )
    parser.add_argument('--beam_size', type=int, nargs='+', default=[4])
    parser.add_argument('--alpha', type=float, nargs='+', default=[0.6])
    parser.add_argument(
        '--length_penalty',
        nargs='+',
        choices=schema.LENGTH_PENALTIES,
        default=None,
        help="'gnmt' ((5 + |y|) / 6)^alpha, 'fairseq' |y|^alpha (default: eval.length_penalty)",
    )
    parser.add_argument('--max_examples', type=int, default=0, help='first N sentences; 0 = all')
    parser.add_argument(
        '--ensemble', nargs='*', default=[], help='other runs decoded together with --workdir'
    )
    parser.add_argument('--out', default=None, help='JSON of the table (default: none)')
    parser.add_argument(
        '--stop_at', type=float, default=None, help='Unix time: no setting predicted past it'
    )
    parser.add_argument(
        '--started_at',
        type=float,
        default=None,
        help='Unix time this process was launched (default: when its main began)',
    )
    parser.add_argument(
        '--test_deadline',
        type=float,
        default=None,
        help='Unix time: keep one fresh evaluate of one setting before it',
    )
    return parser.parse_args(argv)


SETTING = ('average_last', 'beam_size', 'alpha', 'length_penalty')  # what a row is scored with
INTERRUPTED = 'interrupted (SIGINT)'


class _Stop:
    """SIGINT during the sweep, as a flag as well as a KeyboardInterrupt: jax only prints a
    KeyboardInterrupt raised inside one of its garbage-collection callbacks, and the flag,
    checked between settings, still stops the sweep then."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        self.requested = True
        raise KeyboardInterrupt

    def __enter__(self) -> '_Stop':
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)


def _run_and_step(args: argparse.Namespace) -> tuple:
    """(config, split, last checkpoint) of ``--workdir``, or a one-line exit."""
    try:
        config = rundir.read_config(args.workdir)
    except rundir.WorkdirError as e:
        raise SystemExit(f'error: {e}') from None
    split = args.split or config.data.eval_split
    if split == config.data.test_split:
        raise SystemExit(
            f'error: --split {split} is the test split of this run; choose settings on '
            f'{config.data.eval_split} and score the test split once with transformer.evaluate.'
        )
    try:
        last = checkpoint_steps(args.workdir, args.step)[-1]
    except rundir.WorkdirError as e:
        raise SystemExit(f'error: {e}') from None
    return config, split, last


def _kept_rows(args: argparse.Namespace, split: str, last: int) -> list[dict]:
    """The rows of an earlier ``--out`` scored as this sweep would score them (same split,
    last step, sentences and ensemble); the others are dropped, with a line saying so."""
    if not args.out or not os.path.exists(args.out):
        return []
    try:
        with open(args.out) as f:
            rows = json.load(f)['rows']
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f'error: --out {args.out} is not a table of eval_sweep.py ({e}).'
        ) from None
    ensemble = [args.workdir, *args.ensemble] if args.ensemble else None
    kept = [
        r
        for r in rows
        if r['split'] == split
        and r['steps'][-1] == last
        and r.get('max_examples', 0) == args.max_examples
        and r.get('ensemble') == ensemble
    ]
    if len(kept) < len(rows):
        print(f'{len(rows) - len(kept)} rows of {args.out} scored otherwise: dropped')
    return kept


def _save(path: str, table: dict) -> None:
    """``table`` to ``path`` at once or not at all (a stop while writing keeps the last one)."""
    with open(path + '.tmp', 'w') as f:
        json.dump(table, f, indent=2)
    os.replace(path + '.tmp', path)


def _no_time(args: argparse.Namespace, seconds: list[float], startup_s: float) -> str | None:
    """Why the next setting is not started (None: it is), from the ``seconds`` of the
    settings this process scored: the first (compiled, loaded) and the later ones."""
    if not seconds:
        return None
    next_s = max(seconds[1:] or seconds)
    end = time.time() + next_s
    if args.stop_at is not None and end > args.stop_at:
        return f'the next setting (~{next_s:.0f} s) would end after the stop time'
    test_s = startup_s + seconds[0]
    if args.test_deadline is not None and end + test_s > args.test_deadline:
        return (
            f'the next setting (~{next_s:.0f} s) would leave less than a test evaluate '
            f'(~{test_s:.0f} s) before the deadline'
        )
    return None


def _score(args, config, split: str, last: int, todo: list, table: dict, stop: _Stop, began):
    """Scores the settings ``todo`` in order, each row added to ``table`` and saved; returns
    why it stopped before the end (None: it did not)."""
    sweep_dir = rundir.path(args.workdir, rundir.EVAL_DIR, 'sweep')
    os.makedirs(sweep_dir, exist_ok=True)
    seconds, startup_s, loaded = [], 0.0, None
    for k, beam, alpha, rule in todo:
        if stop.requested:
            return INTERRUPTED
        if why := _no_time(args, seconds, startup_s):
            return why
        start = time.time()
        if loaded is None or loaded[0] != k:
            try:  # the average loaded once, then decoded with every beam, alpha and penalty
                config, tokenizer, model, params, member_steps = evaluate.load(
                    args.workdir, last, k, False, args.ensemble
                )
            except rundir.WorkdirError as e:  # e.g. an ensemble run with another vocabulary
                raise SystemExit(f'error: {e}') from None
            eval_set = evaluate.make_eval_set(
                config, tokenizer, args.workdir, split, max_examples=args.max_examples
            )
            loaded = k, member_steps
        startup_s = startup_s or start - began
        scores, hypotheses = score_eval_set(
            config,
            tokenizer,
            model,
            params,
            eval_set,
            beam_size=beam,
            options=decoding.decode_options(config.eval, alpha=alpha, length_penalty=rule),
        )
        name = f'{split}-step{last}-avg{k}-beam{beam}-alpha{alpha}-{rule}'
        name += f'-ensemble{len(args.ensemble) + 1}.txt' if args.ensemble else '.txt'
        with open(os.path.join(sweep_dir, name), 'w') as f:
            f.writelines(h + '\n' for h in hypotheses)
        row = {'split': split, 'steps': loaded[1][0], 'average_last': k}
        row |= {'beam_size': beam, 'alpha': alpha, 'length_penalty': rule}
        row |= {key: scores[key] for key in ('sacrebleu', 'tokenized_bleu', 'chrf')}
        row |= {'seconds': time.time() - start, 'max_examples': args.max_examples}
        if args.ensemble:
            row['ensemble'] = [args.workdir, *args.ensemble]
        table['rows'].append(row)
        table.setdefault('first_s', time.time() - began)  # launch to the first row: a test's
        seconds.append(row['seconds'])
        print(json.dumps(row), flush=True)
        if args.out:
            _save(args.out, table)
    return INTERRUPTED if stop.requested else None


def _print_table(rows: list[dict], split: str) -> None:
    print(
        f'\n| checkpoints averaged | beam | alpha | penalty | {split} tokenized BLEU | sacreBLEU '
        '| chrF |'
    )
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        print(
            f'| {r["average_last"]} (steps {r["steps"][0]}-{r["steps"][-1]}) | {r["beam_size"]} '
            f'| {r["alpha"]} | {r["length_penalty"]} | {r["tokenized_bleu"]:.2f} '
            f'| {r["sacrebleu"]:.2f} | {r["chrf"]:.2f} |'
        )


def main(argv: list[str] | None = None) -> list[dict]:
    began = time.time()
    args = _parse_args(argv)
    compile_cache.configure()  # as every command does (`console.run`): a rerun loads its programs
    began = args.started_at or began
    config, split, last = _run_and_step(args)
    penalties = args.length_penalty or [config.eval.length_penalty]
    grid = list(itertools.product(args.average_last, args.beam_size, args.alpha, penalties))
    rows = _kept_rows(args, split, last)
    todo = [s for s in grid if s not in {tuple(r[k] for k in SETTING) for r in rows}]
    if len(todo) < len(grid):
        print(f'{len(grid) - len(todo)} of {len(grid)} settings already scored at step {last}')
    table = {'workdir': args.workdir, 'split': split, 'step': last, 'settings': len(grid)}
    table |= {'stopped': None, 'rows': rows}
    with _Stop() as stop:
        try:
            stopped = _score(args, config, split, last, todo, table, stop, began)
        except KeyboardInterrupt:
            stopped = INTERRUPTED
    if stopped:
        scored = sum(tuple(r[k] for k in SETTING) in set(grid) for r in rows)
        table['stopped'] = f'stopped after {scored} of {len(grid)} settings: {stopped}'
        print(table['stopped'], flush=True)
    if args.out:
        _save(args.out, table)
    _print_table(rows, split)
    if stopped == INTERRUPTED:
        raise SystemExit(130)
    return rows


if __name__ == '__main__':
    main()
