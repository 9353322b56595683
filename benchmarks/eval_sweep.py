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
so sweeps up to different steps keep their own files; the table is saved as JSON.

``--ensemble RUN [RUN ...]`` decodes those runs together with ``--workdir`` as one ensemble
(`transformer.evaluate`'s ``--ensemble``), every run loaded at the same steps; its hypotheses
go to ...-ensembleM.txt.
"""

import argparse
import itertools
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformer import evaluate, rundir, schema
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = _parse_args(argv)
    compile_cache.configure()  # as every command does (`console.run`): a rerun loads its programs
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
    sweep_dir = rundir.path(args.workdir, rundir.EVAL_DIR, 'sweep')
    os.makedirs(sweep_dir, exist_ok=True)
    rows = []
    for k in args.average_last:
        try:  # the average loaded once, then decoded with every beam, alpha and penalty
            config, tokenizer, model, params, member_steps = evaluate.load(
                args.workdir, last, k, False, args.ensemble
            )
        except rundir.WorkdirError as e:  # e.g. an ensemble run with another vocabulary
            raise SystemExit(f'error: {e}') from None
        eval_set = evaluate.make_eval_set(
            config, tokenizer, args.workdir, split, max_examples=args.max_examples
        )
        penalties = args.length_penalty or [config.eval.length_penalty]
        for beam, alpha, rule in itertools.product(args.beam_size, args.alpha, penalties):
            start = time.time()
            scores, hypotheses = score_eval_set(
                config,
                tokenizer,
                model,
                params,
                eval_set,
                beam_size=beam,
                alpha=alpha,
                length_penalty=rule,
            )
            name = f'{split}-step{last}-avg{k}-beam{beam}-alpha{alpha}-{rule}'
            name += f'-ensemble{len(args.ensemble) + 1}.txt' if args.ensemble else '.txt'
            with open(os.path.join(sweep_dir, name), 'w') as f:
                f.writelines(h + '\n' for h in hypotheses)
            row = {'split': split, 'steps': member_steps[0], 'average_last': k}
            row |= {'beam_size': beam, 'alpha': alpha, 'length_penalty': rule}
            row |= {key: scores[key] for key in ('sacrebleu', 'tokenized_bleu', 'chrf')}
            row['seconds'] = time.time() - start
            if args.ensemble:
                row['ensemble'] = [args.workdir, *args.ensemble]
            rows.append(row)
            print(json.dumps(row), flush=True)
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
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'workdir': args.workdir, 'rows': rows}, f, indent=2)
    return rows


if __name__ == '__main__':
    main()
