r"""The validation figures of training runs side by side, read from their metrics.jsonl.

  python benchmarks/pilot_table.py /work/runs/pilot_tiny /work/runs/pilot_tiny_rdrop \
      /work/runs/pilot_tiny_worddrop
  python benchmarks/pilot_table.py /work/runs/pilot_tiny_rdrop.log    # a run's console log

Prints a markdown table: one row per run and validation step, with the validation loss, NLL
and the validation BLEU of that step (sacreBLEU, lowercased tokenized BLEU), and a run's last
train line (step and R-Drop KL when it logs one). A run still training shows the steps it has
reached. An argument ending in .log is read as train.py's console output instead of a run
directory (its figures rounded as printed). Reads only; needs only the standard library.
"""

from __future__ import annotations

import json
import os
import re
import sys

# train.py's console lines (transformer/training/metrics.py, validation.py).
_TRAIN = re.compile(r'step (\d+)/\d+  loss ([\d.]+)  nll [\d.]+(?:  rdrop kl ([\d.]+))?')
_LOSS = re.compile(r'step (\d+)  validation loss ([\d.]+)  nll ([\d.]+)')
_BLEU = re.compile(r'step (\d+)  validation sacreBLEU ([\d.]+)  tokenized BLEU ([\d.]+)')


def read_log(path: str) -> tuple[dict[int, dict], dict | None]:
    """`read`'s figures from a console log."""
    by_step: dict[int, dict] = {}
    last_train = None
    with open(path) as f:
        for line in f:
            if m := _TRAIN.search(line):
                last_train = {'step': int(m[1]), 'loss': float(m[2])}
                if m[3]:
                    last_train['rdrop_kl'] = float(m[3])
            elif m := _LOSS.search(line):
                by_step.setdefault(int(m[1]), {}).update(loss=float(m[2]), nll=float(m[3]))
            elif m := _BLEU.search(line):
                row = by_step.setdefault(int(m[1]), {})
                row.update(sacrebleu=float(m[2]), tokenized_bleu=float(m[3]))
    return by_step, last_train


def read(workdir: str) -> tuple[dict[int, dict], dict | None]:
    """{step: validation figures} and the last train record of ``workdir``'s metrics.jsonl
    (of the console log ``workdir`` when it ends in .log)."""
    if workdir.endswith('.log'):
        return read_log(workdir)
    by_step: dict[int, dict] = {}
    last_train = None
    path = os.path.join(workdir, 'metrics.jsonl')
    if not os.path.exists(path):
        return by_step, None
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get('split') == 'train':
                last_train = record
            elif record.get('split') == 'validation':
                by_step.setdefault(record['step'], {}).update(record)
    return by_step, last_train


def _number(value, digits: int) -> str:
    return '' if value is None else f'{value:.{digits}f}'


def table(workdirs: list[str]) -> list[str]:
    """The markdown lines of ``workdirs``' validation figures."""
    lines = [
        '| run | step | validation loss | validation NLL | sacreBLEU | tokenized BLEU |',
        '|---|---|---|---|---|---|',
    ]
    for workdir in workdirs:
        name = os.path.basename(os.path.normpath(workdir)).removesuffix('.log')
        by_step, last = read(workdir)
        for step in sorted(by_step):
            row = by_step[step]
            lines.append(
                f'| {name} | {step} | {_number(row.get("loss"), 4)} | '
                f'{_number(row.get("nll"), 4)} | {_number(row.get("sacrebleu"), 2)} | '
                f'{_number(row.get("tokenized_bleu"), 2)} |'
            )
        if last is not None and last['step'] not in by_step:
            kl = f', R-Drop KL {last["rdrop_kl"]:.4f}' if 'rdrop_kl' in last else ''
            lines.append(
                f'| {name} | {last["step"]} (training: loss {last["loss"]:.4f}{kl}) | | | | |'
            )
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[1].strip(), file=sys.stderr)
        return 2
    print('\n'.join(table(argv)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
