"""Large training corpora: preparation time and peak memory, the training process's peak memory
to its first steps, and packed batches per second, for folder corpora of N pairs.

Each corpus is Multi30k's training lines repeated to N pairs (`make_corpus`). For each N:

1. ``prepare``: ``python -m transformer.prepare`` (vocabulary + token store) under
   ``/usr/bin/time``: seconds and peak RSS. A checkout without that command (``--repo`` of an
   earlier version) has this done by its first training run instead, which is then timed.
2. ``train``: ``train.py --config configs/multi30k.py`` (``--config``) for ``--steps`` steps in
   a workdir holding the prepared data: its peak RSS, the data and model of one process.
3. ``batches_per_s``: packed batches of the store (or the earlier version's cache) per second
   over ``--batches`` batches after the first, in a process of that checkout's code (the
   first few hundred after a start are slower: the pages of the store are read in).

    python benchmarks/corpus_scale.py --pairs 500000,4000000,16000000
    python benchmarks/corpus_scale.py --pairs 500000 --repo /tmp/before   # an earlier checkout

The open of the stores it prepares, in bytes read and pages touched: store_open.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / 'shared' / 'data' / 'multi30k'


def make_corpus(folder: pathlib.Path, multi30k: pathlib.Path, pairs: int) -> None:
    """``folder``/train.{en,de}: Multi30k's training pairs repeated to ``pairs`` lines (and its
    validation files as the folder's validation split). Written once; kept for later runs."""
    if (folder / 'done').exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ('en', 'de'):
        lines = (multi30k / f'train.{lang}').read_bytes().splitlines(keepends=True)
        with open(folder / f'train.{lang}', 'wb') as f:
            for i in range(pairs):
                f.write(lines[i % len(lines)])
        (folder / f'validation.{lang}').write_bytes((multi30k / f'val.{lang}').read_bytes())
    (folder / 'done').touch()


def _timed_command(command: list[str], cwd: str, log: pathlib.Path) -> dict[str, float]:
    """Runs ``command`` under /usr/bin/time: its seconds and peak RSS (MiB)."""
    timed = ['/usr/bin/time', '-f', 'PEAK_KIB %M', *command]
    start = time.perf_counter()
    with open(log, 'w') as out:
        done = subprocess.run(timed, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    text = log.read_text()
    if done.returncode:
        raise SystemExit(f'{" ".join(command)} failed ({done.returncode}); see {log}')
    peak = int(re.findall(r'PEAK_KIB (\d+)', text)[-1])
    return {'seconds': seconds, 'peak_rss_mib': peak / 1024}


def _throughput(repo: str, workdir: str, flags: list[str], batches: int) -> float:
    """Packed batches per second from the prepared workdir, in a process of ``repo``'s code."""
    code = f"""
import sys, time
sys.argv = ['x', *{flags!r}]
sys.path.insert(0, {repo!r})
from absl import flags
from ml_collections import config_flags
from transformer import data, rundir, schema
config_flags.DEFINE_config_file('config')
flags.FLAGS(sys.argv)
config = schema.parse(schema.complete(flags.FLAGS.config))
tokenizer = rundir.load_tokenizer(config, {workdir!r})
it = data.make_train_iterator(config.data, tokenizer, batch_size=config.train.batch_size,
    seed=0, cache_dir=rundir.data_cache_dir(config, {workdir!r}))
next(it)
start = time.perf_counter()
for _ in range({batches}):
    next(it)
print('BATCHES_PER_S', {batches} / (time.perf_counter() - start))
"""
    done = subprocess.run(
        [sys.executable, '-c', code], cwd=repo, capture_output=True, text=True, check=True
    )
    return float(re.findall(r'BATCHES_PER_S (\S+)', done.stdout)[-1])


def measure(repo: str, corpus: pathlib.Path, workdir: pathlib.Path, args) -> dict:
    flags = [f'--config={args.config}', '--config.data.dataset=folder']
    flags += [f'--config.data.folder={corpus}', '--config.eval.bleu_every=0']
    flags += ['--config.train.eval_every=0', f'--config.train.checkpoint_every={args.steps}']
    flags += [f'--config.train.num_steps={args.steps}', f'--config.train.log_every={args.steps}']
    result = {}
    has_prepare = (pathlib.Path(repo) / 'transformer' / 'commands' / 'prepare.py').exists()
    python = sys.executable
    if has_prepare:
        command = [python, '-m', 'transformer.prepare', *flags, f'--workdir={workdir}']
    else:  # the earlier version's first run tokenizes and caches
        command = [python, 'train.py', *flags, f'--workdir={workdir}']
    result['prepare'] = _timed_command(command, repo, workdir.with_suffix('.prepare.log'))
    fresh = workdir.with_name(workdir.name + '-train')
    for name in ('vocab', 'data_cache'):  # the prepared data, in a run without checkpoints
        subprocess.run(['cp', '-r', str(workdir / name), str(fresh / name)], check=True)
    command = [python, 'train.py', *flags, f'--workdir={fresh}']
    result['train'] = _timed_command(command, repo, workdir.with_suffix('.train.log'))
    result['batches_per_s'] = _throughput(repo, str(fresh), flags, args.batches)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--pairs', default='500000', help='comma-separated corpus sizes')
    parser.add_argument('--repo', default=str(REPO), help='the checkout whose code is measured')
    parser.add_argument('--multi30k', default=str(DEFAULT_MULTI30K))
    parser.add_argument('--scratch', default='/tmp/corpus_scale', help='corpora and workdirs')
    parser.add_argument('--config', default='configs/multi30k.py', help="train.py's config")
    parser.add_argument('--steps', type=int, default=2)
    parser.add_argument('--batches', type=int, default=2000)
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/corpus_scale.json'))
    args = parser.parse_args(argv)
    scratch = pathlib.Path(args.scratch)
    tag = subprocess.run(
        ['git', '-C', args.repo, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True
    ).stdout.strip()
    report = {'repo': args.repo, 'commit': tag, 'config': args.config, 'steps': args.steps}
    report['sizes'] = {}
    for pairs in [int(p) for p in args.pairs.split(',')]:
        corpus = scratch / f'corpus-{pairs}'
        make_corpus(corpus, pathlib.Path(args.multi30k), pairs)
        workdir = scratch / f'run-{tag}-{pairs}'
        for path in (workdir, workdir.with_name(workdir.name + '-train')):
            subprocess.run(['rm', '-rf', str(path)], check=True)
            path.mkdir(parents=True)
        report['sizes'][pairs] = measure(args.repo, corpus, workdir, args)
        print(json.dumps({pairs: report['sizes'][pairs]}), flush=True)
    report['machine'] = common.host()
    common.write_report(args.out, report)


if __name__ == '__main__':
    main()
