r"""The paper's model against the modern variant (rotary positions, RMSNorm, pre-LN, SwiGLU,
QK-norm, grouped keys/values: configs/tiny.py `MODERN`), trained one after the other on the
same machine: validation loss and BLEU, step time.

  python benchmarks/modern_parts.py --out benchmarks/results/modern_parts_tiny.json \
      --run paper=configs/tiny.py --run modern=configs/tiny.py:modern
  python benchmarks/modern_parts.py --out benchmarks/results/modern_parts_multi30k.json \
      --run paper=configs/multi30k.py:tiny --run modern=configs/multi30k.py:tiny_modern \
      --set data.manual_dir=../shared/data/multi30k --set train.num_steps=800 \
      --set train.batch_size=64

Each run (``NAME=CONFIG``) is ``python train.py`` in a process of its own, in OUT's folder
(``--scratch``, default beside ``--out``), never two at once, so that the step times compare;
then ``transformer.evaluate --split validation`` at its last step scores it with the config's
decoding (beam, alpha, checkpoints averaged). The report holds per run: the parameters, the
last validation loss and NLL (train.py's), validation BLEU (sacreBLEU and the config's
tokenized BLEU), the median seconds per step of the train records after the first (the first
holds the compilation) and the first record's. A run directory that holds a finished run
trains nothing again.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402


def _records(workdir: pathlib.Path, split: str) -> list[dict]:
    with open(workdir / 'metrics.jsonl') as f:
        return [r for r in map(json.loads, f) if r['split'] == split]


def train(name: str, config: str, workdir: pathlib.Path, settings: list[str]) -> float:
    """Trains ``config`` into ``workdir`` (its console in ``workdir``.log); the wall seconds."""
    flags = [f'--config.{s}' for s in settings]
    command = [sys.executable, str(ROOT / 'train.py'), f'--config={config}', f'--workdir={workdir}']
    start = time.perf_counter()
    with open(f'{workdir}.log', 'a') as log:
        print(f'[{name}] {" ".join(command + flags)}', flush=True)
        subprocess.run([*command, *flags], cwd=ROOT, stdout=log, stderr=log, check=True)
    return time.perf_counter() - start


def validate(workdir: pathlib.Path) -> dict:
    """``transformer.evaluate --split validation`` of the run's last step: its scores."""
    command = [sys.executable, '-m', 'transformer.evaluate', f'--workdir={workdir}']
    with open(f'{workdir}.log', 'a') as log:
        subprocess.run(
            [*command, '--split=validation'], cwd=ROOT, stdout=log, stderr=log, check=True
        )
    scores = sorted((workdir / 'eval').glob('validation-*.json'), key=os.path.getmtime)[-1]
    return json.loads(scores.read_text())


def summary(workdir: pathlib.Path, scores: dict) -> dict:
    """What the report says of one run, from its records and ``scores``."""
    trained = _records(workdir, 'train')
    losses = [r for r in _records(workdir, 'validation') if 'loss' in r]
    seconds = [1.0 / r['steps_per_s'] for r in trained[1:]]
    config = json.loads((workdir / 'config.json').read_text())
    return {
        'steps': trained[-1]['step'],
        'parameters': _parameters(workdir),
        'validation_loss': losses[-1]['loss'],
        'validation_nll': losses[-1]['nll'],
        'sacrebleu': scores['sacrebleu'],
        'tokenized_bleu': scores.get('tokenized_bleu'),
        'median_s_per_step': statistics.median(seconds) if seconds else None,
        'first_record_s_per_step': 1.0 / trained[0]['steps_per_s'],
        'model': {k: config['model'].get(k) for k in MODEL_KEYS},
    }


MODEL_KEYS = ('positions', 'norm', 'pre_layer_norm', 'ffn', 'qk_norm', 'num_kv_heads', 'd_ff')


def _parameters(workdir: pathlib.Path) -> int:
    from transformer import rundir
    from transformer.model import config_from_dict, param_count

    config = rundir.read_config(str(workdir))
    vocab = rundir.load_tokenizer(config, str(workdir)).vocab_size
    return param_count(config_from_dict(config.model, vocab))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--run', action='append', required=True, help='NAME=CONFIG')
    parser.add_argument('--set', action='append', default=[], help='KEY=VALUE for every run')
    parser.add_argument('--out', required=True, help='the report (JSON)')
    parser.add_argument('--scratch', help="the runs' folder (default: OUT without .json)")
    args = parser.parse_args(argv)
    scratch = pathlib.Path(args.scratch or str(args.out).removesuffix('.json'))
    scratch.mkdir(parents=True, exist_ok=True)
    report = {'host': common.host(), 'settings': args.set, 'runs': {}}
    for spec in args.run:
        name, _, config = spec.partition('=')
        workdir = scratch / name
        wall = train(name, config, workdir, args.set)
        report['runs'][name] = {
            'config': config,
            'train_wall_s': wall,
            **summary(workdir, validate(workdir)),
        }
        print(json.dumps({name: report['runs'][name]}), flush=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + '\n')
    return report


if __name__ == '__main__':
    main()
