"""Where a traced step's device time goes: the kernels of a `jax.profiler` trace (its Perfetto
JSON), summed by name and by kind (matrix products, reductions, elementwise fusions, attention,
scatters, copies). benchmarks/gpu_check.py and step_variants.py read their traces with it.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re

KINDS = ('matmul', 'reduction', 'elementwise', 'attention', 'scatter', 'copy/transpose', 'other')
# A kernel's kind from its name, the first rule that matches: cuDNN attention kernels' names may
# contain 'gemm' or 'dot', fusions' names contain 'fusion' whatever their main operation is.
# ynn_* are the CPU's XNNPACK/YNNPACK kernels, which XLA hands its dots to.
KIND_RULES = (
    ('attention', ('cudnn', 'flash', 'sdpa', 'fmha', 'dot_do_o')),
    ('matmul', ('gemm', 'cublas', 'matmul', 'nvjet', 'cutlass', 'dot', 'ynn')),
    ('scatter', ('scatter',)),
    ('reduction', ('reduce', 'softmax')),
    ('copy/transpose', ('copy', 'transpose', 'memcpy', 'memset')),
    ('elementwise', ('loop_', 'fusion', 'wrapped_', 'elementwise')),
)
TOP_KERNELS = 25


def kernel_kind(name: str) -> str:
    """The kind (one of KINDS) of a kernel named ``name``."""
    lowered = name.lower()
    for kind, parts in KIND_RULES:
        if any(part in lowered for part in parts):
            return kind
    return 'other'


def _kernel_events(trace: dict) -> tuple[str, list[dict]]:
    """('gpu' | 'cpu', the complete events that are kernels) of a Chrome-trace JSON.

    On a GPU those are the events of the first GPU's process (``/device:GPU:0``), on its stream
    threads when it names them (other lines there repeat the kernels' time by XLA op or module).
    On a CPU they are XLA's thunks, the events that carry an ``hlo_op`` argument.
    """
    events = trace['traceEvents'] if isinstance(trace, dict) else trace
    processes, threads = {}, {}
    for e in events:
        if e.get('ph') == 'M' and e.get('name') == 'process_name':
            processes[e['pid']] = e['args']['name']
        elif e.get('ph') == 'M' and e.get('name') == 'thread_name':
            threads[(e['pid'], e.get('tid'))] = e['args']['name']
    complete = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
    gpu = {pid for pid, name in processes.items() if re.match(r'/device:GPU:0\b', name)}
    if gpu:
        on_gpu = [e for e in complete if e['pid'] in gpu]
        streams = [
            e for e in on_gpu if threads.get((e['pid'], e.get('tid')), '').startswith('Stream')
        ]
        return 'gpu', streams or on_gpu
    return 'cpu', [e for e in complete if 'hlo_op' in e.get('args', {})]


def kernel_table(trace: dict, steps: int) -> dict:
    """Kernel time per step of a traced run of ``steps`` steps: by kind and the longest kernels.

    Args:
      trace: the trace's JSON (``{'traceEvents': [...]}`` or the list of events).
      steps: how many steps the trace holds.

    Returns:
      {'device', 'steps', 'kernels' (distinct names), 'ms_per_step' (all kernels),
      'kinds': [{'kind', 'ms_per_step', 'share'}] in KINDS order,
      'top': [{'name', 'kind', 'ms_per_step', 'share', 'calls_per_step'}], longest first}.
    """
    device, events = _kernel_events(trace)
    by_name, calls = collections.Counter(), collections.Counter()
    for e in events:
        by_name[e['name']] += float(e['dur'])  # microseconds
        calls[e['name']] += 1
    total = sum(by_name.values())
    by_kind = collections.Counter()
    for name, us in by_name.items():
        by_kind[kernel_kind(name)] += us

    def share(us: float) -> float:
        return us / total if total else 0.0

    return {
        'device': device,
        'steps': steps,
        'kernels': len(by_name),
        'ms_per_step': total / 1e3 / steps,
        'kinds': [
            {'kind': k, 'ms_per_step': by_kind[k] / 1e3 / steps, 'share': share(by_kind[k])}
            for k in KINDS
        ],
        'top': [
            {
                'name': name,
                'kind': kernel_kind(name),
                'ms_per_step': us / 1e3 / steps,
                'share': share(us),
                'calls_per_step': calls[name] / steps,
            }
            for name, us in by_name.most_common(TOP_KERNELS)
        ],
    }


def load_trace(directory: str) -> dict:
    """The Perfetto JSON that `jax.profiler.trace(create_perfetto_trace=True)` wrote under
    ``directory`` (plugins/profile/RUN/perfetto_trace.json.gz)."""
    for pattern in ('perfetto_trace.json.gz', '*.trace.json.gz'):
        found = sorted(glob.glob(os.path.join(directory, '**', pattern), recursive=True))
        if found:
            with gzip.open(found[-1], 'rt') as f:
                return json.load(f)
    raise FileNotFoundError(f'no *.trace.json.gz under {directory}')
