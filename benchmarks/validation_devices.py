"""Wall time of validation BLEU on one device against every device of the machine.

    python benchmarks/validation_devices.py --workdir RUN [--repeats 3] [--out FILE.json]

Decodes and scores the run's validation split (``data.eval_split``, its first
``eval.bleu_max_examples`` sentences, beam ``eval.beam_size``) as training's validation does
(`evaluation.score_eval_set` with the run's decoding layout), once on this process's first
device and once on all of the default backend's devices (a data-only mesh), alternating the
two ``--repeats`` times after one untimed warm-up each (compilation). Prints and saves each
time, the ratio of the medians (all devices / one) and the spread of the ratios of the paired
runs. On a CPU, ``--host_devices N`` (default 8) splits the host into N XLA devices before
jax loads; they share the same cores, so no speed-up is possible there beyond what a busy
host's threads give. Without ``--workdir`` a tiny run (configs/tiny.py, 200 steps) is trained
into a temporary directory first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tiny_run(workdir: str) -> None:
    from transformer import configs
    from transformer.commands import train as trainer

    config = configs.load('tiny')
    config.train.num_steps = 200
    config.train.eval_every = 0
    config.train.async_checkpointing = False
    trainer.train_and_evaluate(config, workdir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', default=None)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--host_devices', type=int, default=8)
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)
    flag = f'--xla_force_host_platform_device_count={args.host_devices}'
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {flag}'.strip()
    import jax

    from transformer import data as data_lib
    from transformer import rundir
    from transformer.commands import decoding_run
    from transformer.evaluation import score_eval_set

    workdir = args.workdir or tempfile.mkdtemp(prefix='validation-devices-')
    if args.workdir is None:
        _tiny_run(workdir)
    runs = {
        'one device': jax.devices()[:1],
        f'{len(jax.devices())} devices': jax.devices(),
    }
    loaded = {
        name: decoding_run.load_run(workdir, devices=devices, parallelism='sharding', fsdp=False)
        for name, devices in runs.items()
    }
    first = next(iter(loaded.values()))
    config, tokenizer = first.config, first.tokenizer
    limit = config.eval.bleu_max_examples
    eval_set = data_lib.make_eval_set(
        config.data,
        tokenizer,
        config.data.eval_split,
        batch_size=config.eval.batch_size,
        cache_dir=rundir.data_cache_dir(config, workdir),
        max_examples=limit if limit > 0 else None,
    )

    def bleu(name: str) -> tuple[float, float]:
        run = loaded[name]
        start = time.perf_counter()
        scores, _ = score_eval_set(
            *(config, tokenizer, run.model, run.params, eval_set),
            beam_size=config.eval.beam_size,
            layout=run.layout,
        )
        return time.perf_counter() - start, scores['sacrebleu']

    for name in runs:
        bleu(name)  # compiles
    times: dict[str, list[float]] = {name: [] for name in runs}
    scores = {}
    for _ in range(args.repeats):
        for name in runs:
            seconds, scores[name] = bleu(name)
            times[name].append(seconds)
    one, many = times.values()
    ratios = [m / o for o, m in zip(one, many, strict=True)]
    result = {
        'device': jax.devices()[0].device_kind,
        'devices': len(jax.devices()),
        'sentences': len(eval_set.references),
        'beam_size': config.eval.beam_size,
        'seconds': times,
        'sacrebleu': scores,
        'ratio_of_medians': statistics.median(many) / statistics.median(one),
        'ratio_spread': [min(ratios), max(ratios)],
        'load_average': os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)


if __name__ == '__main__':
    main()
