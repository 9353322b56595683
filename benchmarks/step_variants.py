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

On a GPU two more kinds of row come from processes of their own, after the table above:
``--flags`` sets of XLA flags (`FLAG_SETS`; an unknown flag kills a process, so each one is
first given to a child that only starts jax on the CPU, and a flag it refuses is left out
with the child's line), each timing the default step with ``XLA_FLAGS`` plus the set; and
``--peer``, benchmarks/torch_peer.py on the same shapes, which adds the column
ours / torch.compile. Meanwhile this process holds ``XLA_PYTHON_CLIENT_MEM_FRACTION`` 0.45 of
the GPU, leaving the rest to them. ``--deadline_s`` bounds it all: rounds stop, profiles and
children are left out, each with a line, when the time is short.

Writes ``--out``/variants.json and variants.md: variant | ms/step (median of the rounds, min and
max) | MFU | change vs default | XLA temporaries | non-GEMM share | compile s (| ours /
torch.compile).
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

from benchmarks import common, kernel_time, torch_peer, train_speed, xla_flags  # noqa: E402
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
# name -> XLA flags, each set timed in a process of its own (module docstring). Triton for every
# fusion goes after the reductions and elementwise fusions (a third of the kernel time,
# docs/performance.md); cuBLAS for every matrix product after the matmuls' share. cuDNN's layer
# norm measured +0.5% on an H200 and was dropped (docs/experiments.md, "Removed options").
FLAG_SETS = {
    'triton_fusions': '--xla_gpu_experimental_all_fusions_with_triton=true',
    'cublas_gemm': '--xla_gpu_enable_triton_gemm=false',
}
# The share of the GPU this process keeps while --flags and --peer children run.
MEM_FRACTION = '.45'
# Seconds kept, under --deadline_s, for each flag set's child and for the peer's.
FLAG_CHILD_S, PEER_CHILD_S = 60.0, 90.0
START = time.perf_counter()


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
    of ``names`` (None: all of `VARIANTS`) that changes what runs on this backend."""
    default = configs.load(config_name)
    for setting in settings:
        key, value = setting.split('=', 1)
        default.update_from_flattened_dict({key: _parse_value(value)})
    out = {'default': default}
    for name in list(VARIANTS) if names is None else names:
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
        # As training compiles it (with the options of transformer/model/remat.py).
        self.compiled = self.parallel.compile_step(self.state, self.batches[0], self.rng)
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
    names = [] if args.only_default else args.variants
    variants_configs = variant_configs(args.config, args.set, names)
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
        if r and time_left(args) < 0:
            print(f'deadline: {r} rounds of {args.rounds} timed', flush=True)
            break
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
        if args.profile_steps and time_left(args) < 0:
            print(f'deadline: {v.name} and the variants after it not profiled', flush=True)
            break
        if args.profile_steps:
            result['kernels'] = v.profile(args.profile_steps)
            result['non_gemm_share'] = non_gemm_share(result['kernels'])
            write(report)
    return report


def time_left(args: argparse.Namespace) -> float:
    """Seconds to ``--deadline_s`` (infinite without one), less what the children after the
    table are kept (`FLAG_CHILD_S`, `PEER_CHILD_S`)."""
    if not args.deadline_s:
        return float('inf')
    return args.deadline_s - (time.perf_counter() - START) - getattr(args, 'reserve_s', 0.0)


def markdown(report: dict) -> str:
    """The variants table, and the lines of what was left out."""
    torch_ms = (report.get('peer') or {}).get('ms_per_step')
    lines = [
        f'Step variants: {report["config"]} {" ".join(report["settings"])}, {report["device"]}, '
        f'jax {report["jax"]}; {report["batch_rows"]} x {report["max_len"]} packed rows, '
        f'{report["rounds"]} rounds x {report["steps_per_round"]} steps; default = '
        + ', '.join(f'{k}={v}' for k, v in report['default_resolves'].items()),
        '',
        '| variant | ms/step (min-max) | MFU | vs default | temporaries MiB | non-GEMM '
        '| compile s |' + (' ours / torch.compile |' if torch_ms else ''),
        '|---|---|---|---|---|---|---|' + ('---|' if torch_ms else ''),
    ]
    for r in report['variants']:
        temp = '' if r['temp_bytes'] is None else f'{r["temp_bytes"] / 2**20:.0f}'
        share = f'{r["non_gemm_share"]:.1%}' if 'non_gemm_share' in r else ''
        lines.append(
            f'| {r["variant"]} | {r["ms_per_step"]:.2f} ({r["ms_min"]:.2f}-{r["ms_max"]:.2f}) '
            f'| {r["mfu"]:.1%} | {r["change_vs_default"]:+.1%} | {temp} | {share} '
            f'| {r["compile_s"]:.0f} |'
            + (f' {r["ms_per_step"] / torch_ms:.2f} |' if torch_ms else '')
        )
    if torch_ms:
        peer = report['peer']
        lines.append(f'\nPyTorch peer ({peer["impl"]}, same shapes): {torch_ms:.2f} ms/step')
    if report.get('left_out'):
        lines += ['', *(f'- {line}' for line in report['left_out'])]
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
    add('--only_default', action='store_true', help='time the default step alone')
    add('--flags', nargs='*', choices=sorted(FLAG_SETS), default=list(FLAG_SETS),
        help='XLA flag sets, each in a process of its own (a GPU only; bare: none)')  # fmt: skip
    add('--peer', action='store_true', help='also time benchmarks/torch_peer.py (a GPU only)')
    add('--deadline_s', type=float, default=0, help='limit of the whole command (0: none)')
    add('--out', required=True, help='directory of variants.json and variants.md')
    return parser.parse_args(argv)


def child_argv(args: argparse.Namespace) -> list[str]:
    """The flags a child timing the default step shares with this process."""
    argv = [f'--config={args.config}', *(f'--set={setting}' for setting in args.set)]
    for name in ('steps', 'rounds', 'warmup', 'batches'):
        argv.append(f'--{name}={getattr(args, name)}')
    return argv


def run_children(args: argparse.Namespace, report: dict) -> None:
    """The --flags rows and the --peer figure, each from a process of its own, added to
    ``report``; what cannot run is left out with a line (``report['left_out']``)."""
    left_out = report.setdefault('left_out', [])
    backend = jax.default_backend()
    wanted = [f'flags={name}' for name in args.flags] + (['peer'] if args.peer else [])
    if backend != 'gpu':
        left_out += [f'{name}: runs on a GPU only; left out on {backend}' for name in wanted]
        return
    base_ms = report['variants'][0]['ms_per_step']
    for name in args.flags:
        flags, left = FLAG_SETS[name], time_left(args) + args.reserve_s
        limit = min(2 * FLAG_CHILD_S, left - PEER_CHILD_S * args.peer)  # the peer's time kept
        refused = xla_flags.known(flags)
        if refused or limit < FLAG_CHILD_S / 2:
            left_out.append(f'flags={name} ({flags}): ' + (refused or 'no time left'))
            continue
        row = xla_flags.time_default(child_argv(args), flags, limit, MEM_FRACTION)
        if isinstance(row, str):
            left_out.append(f'flags={name} ({flags}): {row}')
            continue
        row |= {'variant': f'flags={name}', 'setting': f'XLA_FLAGS+={flags} (own process)'}
        row['change_vs_default'] = row['ms_per_step'] / base_ms - 1.0
        report['variants'].append(row)
    if args.peer:
        left = time_left(args) + args.reserve_s
        peer = torch_peer.run_child(args.config, args.set, 'compile', left) if left > 60 else {
            'error': 'no time left'}  # fmt: skip
        if 'error' in peer:
            left_out.append(f'peer: {peer["error"]}')
        else:
            report['peer'] = peer['modes']['compile'] | {'shapes': peer['shapes']}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    if args.flags or args.peer:  # before jax starts: the children need GPU memory
        os.environ.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', MEM_FRACTION)
    on_gpu = jax.default_backend() == 'gpu'
    args.reserve_s = on_gpu * (FLAG_CHILD_S * len(args.flags) + PEER_CHILD_S * args.peer)

    def write(report: dict) -> None:
        common.write_report(out / 'variants.json', report)
        (out / 'variants.md').write_text(markdown(report))

    report = measure(args, write)
    run_children(args, report)
    write(report)
    print(markdown(report))
    return report


if __name__ == '__main__':
    main()
