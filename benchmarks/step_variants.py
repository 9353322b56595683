r"""The training step's accelerator-dependent choices, each timed against the default.

  python benchmarks/step_variants.py --config configs/base.py --set model.dtype=bfloat16 \
      --out /tmp/variants                                     # a GPU: ~4 minutes on an H100
  python benchmarks/step_variants.py --config configs/tiny.py --steps 5 --rounds 2 \
      --out /tmp/variants                                     # the same, end to end, on a CPU

Every variant is the default config with one setting changed (`VARIANTS`: the embedding
gradient, the loss chunking, the attention implementation (cuDNN, einsum, and Pallas with
segment ids for packed self-attention), the dropout PRNG); a variant that
resolves to the default's own value on this backend (``'auto'``, `backends.platform.WINNERS`) is
left out. All of them are built and compiled first (in threads: XLA compiles outside the
GIL), on the same random packed batches of the config's shape (`train_speed.random_packed_batches`),
placed on the device once; then ``--rounds`` rounds time ``--steps`` steps of each variant in
turn, so that drift of the machine shows as spread in every row alike rather than as a
difference between rows. ``--profile_steps`` more steps of each are traced with
`jax.profiler`, for the share of kernel time outside the matrix products and the attention
kernels (`kernel_time.kernel_table`: reductions, elementwise fusions, scatters, copies).

Writes ``--out``/variants.json and variants.md: variant | ms/step (median of the rounds, min and
max) | MFU | change vs default | XLA temporaries | non-GEMM share | compile s.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common, kernel_time, train_speed  # noqa: E402
from transformer import configs  # noqa: E402
from transformer.backends import platform  # noqa: E402
from transformer.model import peak_flops, train_flops  # noqa: E402

# name -> the one setting it changes (KEY=VALUE, as --config.KEY=VALUE). 'default' is the
# config as given.
VARIANTS = {
    'attention=einsum': 'model.attention_impl=einsum',
    'attention=fused': 'model.attention_impl=fused',
    'attention=pallas': 'model.attention_impl=pallas',
    'embedding_grad=scatter': 'model.embedding_grad=scatter',
    'embedding_grad=one_hot': 'model.embedding_grad=one_hot',
    'embedding_grad=sorted_scatter': 'model.embedding_grad=sorted_scatter',
    'loss_chunk_tokens=8192': 'train.loss_chunk_tokens=8192',
    'dropout_prng=rbg': 'train.dropout_prng=rbg',
    'dropout_prng=unsafe_rbg': 'train.dropout_prng=unsafe_rbg',
}
RESOLVED = {'model.attention_impl': 'attention_impl', 'model.embedding_grad': 'embedding_grad'}


def _parse_value(text: str):
    """A command-line value as the config's type would take it (int, float, bool or str)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {'True': True, 'False': False}.get(text, text)


def _get(config, key: str):
    node = config
    for part in key.split('.'):
        node = node[part]
    return node


def _resolved(key: str, value):
    """The value ``key=value`` takes on this backend ('auto' resolved)."""
    return platform.resolve(RESOLVED[key], value) if key in RESOLVED else value


def variant_configs(config_name: str, settings: list[str], names: list[str] | None) -> dict:
    """{name: ConfigDict}: 'default' (``config_name`` with ``settings``), then each variant
    of ``names`` (default: all of `VARIANTS`) that changes what runs on this backend."""
    default = configs.load(config_name)
    for setting in settings:
        key, value = setting.split('=', 1)
        default.update_from_flattened_dict({key: _parse_value(value)})
    out = {'default': default}
    for name in names or list(VARIANTS):
        key, value = VARIANTS[name].split('=', 1)
        if _resolved(key, _get(default, key)) == _resolved(key, _parse_value(value)):
            print(f'{name}: the default on {jax.default_backend()}; not timed again', flush=True)
            continue
        config = default.copy_and_resolve_references()
        config.update_from_flattened_dict({key: _parse_value(value)})
        out[name] = config
    return out


class Variant:
    """One variant's model, state, placed batches and compiled step; a copy of ``initial``'s
    parameters and optimizer state where given (the variants change no parameter's shape),
    so that the model is initialised once."""

    def __init__(self, name: str, config, batches: list[dict], initial=None):
        self.name, self.config = name, config
        self.model, self.parallel, self.state, _, self.rng, self.num_params = (
            train_speed.random_setup(config, initial)
        )
        self.batches = [self.parallel.put_batch(b) for b in batches]
        self.times: list[float] = []

    def compile(self) -> Variant:
        start = time.perf_counter()
        lowered = self.parallel.lower_step(self.state, self.batches[0], self.rng)
        self.compiled = lowered.compile()
        self.compile_s = time.perf_counter() - start
        self.temp_bytes = train_speed.temp_bytes(self.compiled)
        return self

    def run(self, steps: int) -> float:
        """Seconds of ``steps`` steps, the batches in turn, waited for at the end."""
        start = time.perf_counter()
        for i in range(steps):
            self.state, sums = self.compiled(
                self.state, self.batches[i % len(self.batches)], self.rng
            )
        jax.block_until_ready(sums)
        self.loss = float(np.asarray(sums['loss']).reshape(-1)[0]) / float(
            np.asarray(sums['tokens']).reshape(-1)[0]
        )
        return time.perf_counter() - start

    def profile(self, steps: int) -> dict:
        directory = tempfile.mkdtemp(prefix=f'variants-{self.name.replace("=", "-")}-')
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            self.run(steps)
        return kernel_time.kernel_table(kernel_time.load_trace(directory), steps)


def non_gemm_share(kernels: dict) -> float:
    """Kernel time outside the matrix products and the attention kernels, as a share."""
    shares = {k['kind']: k['share'] for k in kernels['kinds']}
    return 1.0 - shares.get('matmul', 0.0) - shares.get('attention', 0.0)


def measure(args: argparse.Namespace, write=None) -> dict:
    """The report; ``write(report)`` is called once the rounds are timed (no profiles yet) and
    again after each variant's profile, so that a time limit still leaves the figures."""
    variants_configs = variant_configs(args.config, args.set, args.variants)
    default = variants_configs['default']
    rows, length = default.train.batch_size, default.data.max_len
    gen = train_speed.random_packed_batches(rows, length, default.data.vocab_size)
    batches = [next(gen) for _ in range(args.batches)]
    print(f'building {len(variants_configs)} variants ...', flush=True)
    first = Variant('default', default, batches)
    variants = [first] + [
        Variant(n, c, batches, first.state) for n, c in variants_configs.items() if n != 'default'
    ]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.compile_threads) as pool:
        for v in pool.map(Variant.compile, variants):
            print(f'{v.name}: compiled in {v.compile_s:.1f} s', flush=True)
    compile_wall = time.perf_counter() - start
    for v in variants:
        v.run(args.warmup)
    for r in range(args.rounds):
        for v in variants:
            v.times.append(1e3 * v.run(args.steps) / args.steps)
        print(f'round {r + 1}: ' + ', '.join(f'{v.name} {v.times[-1]:.2f}' for v in variants))
    device = jax.devices()[0]
    dtype = str(default.model.dtype)
    peak, peak_source = peak_flops(device, dtype)
    base_ms = statistics.median(variants[0].times)
    results = []
    for v in variants:
        ms = statistics.median(v.times)
        step_flops = train_flops(v.model.config, rows, length, length)
        results.append(
            {
                'variant': v.name,
                'setting': VARIANTS.get(v.name, ''),
                'ms_per_step': ms,
                'ms_min': min(v.times),
                'ms_max': max(v.times),
                'ms_rounds': v.times,
                'mfu': step_flops / (ms / 1e3) / peak,
                'change_vs_default': ms / base_ms - 1.0,
                'temp_bytes': v.temp_bytes,
                'compile_s': v.compile_s,
                'loss_after': v.loss,
            }
        )
    report = common.host() | {
        'config': args.config,
        'settings': args.set,
        'dtype': dtype,
        'batch_rows': rows,
        'max_len': length,
        'params': int(variants[0].num_params),
        'steps_per_round': args.steps,
        'rounds': args.rounds,
        'peak_flops_per_s': peak,
        'peak_source': peak_source,
        'compile_wall_s': compile_wall,
        'default_resolves': {k: _resolved(k, _get(default, k)) for k in RESOLVED},
        'variants': results,
    }
    write = write or (lambda report: None)
    write(report)
    for v, result in zip(variants, results, strict=True):
        if args.profile_steps:
            result['kernels'] = v.profile(args.profile_steps)
            result['non_gemm_share'] = non_gemm_share(result['kernels'])
            write(report)
    return report


def markdown(report: dict) -> str:
    """The variants table."""
    lines = [
        f'Step variants: {report["config"]} {" ".join(report["settings"])}, {report["device"]}, '
        f'jax {report["jax"]}; {report["batch_rows"]} x {report["max_len"]} packed rows, '
        f'{report["rounds"]} rounds x {report["steps_per_round"]} steps; default = '
        + ', '.join(f'{k}={v}' for k, v in report['default_resolves'].items()),
        '',
        '| variant | ms/step (min-max) | MFU | vs default | temporaries MiB | non-GEMM '
        '| compile s |',
        '|---|---|---|---|---|---|---|',
    ]
    for r in report['variants']:
        temp = '' if r['temp_bytes'] is None else f'{r["temp_bytes"] / 2**20:.0f}'
        share = f'{r["non_gemm_share"]:.1%}' if 'non_gemm_share' in r else ''
        lines.append(
            f'| {r["variant"]} | {r["ms_per_step"]:.2f} ({r["ms_min"]:.2f}-{r["ms_max"]:.2f}) '
            f'| {r["mfu"]:.1%} | {r["change_vs_default"]:+.1%} | {temp} | {share} '
            f'| {r["compile_s"]:.0f} |'
        )
    return '\n'.join(lines) + '\n'


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add('--config', default='configs/base.py', help='config name or path')
    add('--set', action='append', default=[], help='KEY=VALUE on the default (model.dtype=...)')
    add('--variants', nargs='+', choices=sorted(VARIANTS), help='default: all of them')
    add('--steps', type=int, default=25, help='timed steps of a variant per round')
    add('--rounds', type=int, default=3, help='rounds over all variants')
    add('--warmup', type=int, default=2, help='untimed steps of each variant first')
    add('--batches', type=int, default=4, help='distinct batches the steps take in turn')
    add('--profile_steps', type=int, default=2, help='steps traced per variant (0: none)')
    add('--compile_threads', type=int, default=4, help='variants compiled at once')
    add('--out', required=True, help='directory of variants.json and variants.md')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = pathlib.Path(args.out)

    def write(report: dict) -> None:
        common.write_report(out / 'variants.json', report)
        (out / 'variants.md').write_text(markdown(report))

    report = measure(args, write)
    print(markdown(report))
    return report


if __name__ == '__main__':
    main()
