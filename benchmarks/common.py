"""What every benchmark script shares: the host a figure was measured on, best-of-N timing of a
jax computation, and writing the report.

The scripts run as ``python benchmarks/NAME.py``; each puts the repository root on
``sys.path`` and imports ``from benchmarks import common``.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def cpu_model() -> str:
    """The host CPU's model name (Linux), so that figures from different hosts are told apart."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict[str, Any]:
    """The machine and software a figure comes from; the load average says whether other work
    shared the cores (timings on a shared 2-core host drift with it)."""
    device = jax.devices()[0]
    return {
        'device': f'{device.platform}:{device.device_kind}',
        'num_devices': jax.device_count(),
        'cpu': cpu_model(),
        'cpu_count': os.cpu_count(),
        'load_average_1min': os.getloadavg()[0],
        'platform': platform.platform(),
        'python': platform.python_version(),
        'jax': jax.__version__,
    }


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[Any, dict[str, float]]:
    """``fn()``'s result and its timings: the first call (compilation included), then the best
    and the median of ``repeats`` more, each waited for (``jax.block_until_ready``)."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return out, {
        'first_call_s': first,
        'best_s': min(times),
        'median_s': statistics.median(times),
    }


def write_report(path: str | os.PathLike, report: dict[str, Any]) -> None:
    """Writes ``report`` as indented JSON to ``path`` (its folder created) and says where."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + '\n')
    print(f'saved {out}')
