"""glibc malloc settings that keep a CPU training step's buffers mapped between steps.

On a CPU, every execution of a compiled step asks for its temporaries in one block (548 MB
for a `configs/multi30k.py` step), and XLA's worker threads allocate it with glibc's
``malloc``. A thread other than the main one allocates from a secondary arena, which serves
blocks that large with a fresh ``mmap`` and returns them with ``munmap`` however glibc's
thresholds are set, so every step page-faults its way through the whole block again: ~2.9M
minor faults and 7.4 s of kernel time in 15 steps, against 0.4-0.6M and 2.3-2.9 s with the
settings below (the multi30k step measured 1022 / 1092 ms without and 890 / 881 ms with
them, runs alternated on a 2-core AMD EPYC; peak RSS 1.2 -> 1.7-2.3 GB).

``keep_freed_memory`` therefore makes every thread use the main arena (``M_ARENA_MAX`` 1),
serves large blocks from the heap instead of ``mmap`` (``M_MMAP_MAX`` 0) and keeps freed
memory instead of returning it to the system (``M_TRIM_THRESHOLD``), so that the next step
reuses the same, already mapped pages. Every command calls `configure` when it starts
(transformer/commands/console.py), which applies them on Linux with glibc and where jax will run on
the CPU (JAX_PLATFORMS is 'cpu', or unset with no GPU/TPU plugin installed); set
``TRANSFORMER_MALLOC=system`` to keep glibc's defaults. They apply to the whole process (a
torch model in the same process gains alike) and take full effect before jax's first
computation: threads that have already allocated keep their arena.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Mapping

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_KEEP_BYTES = 2**31 - 1  # freed memory kept by the heap (mallopt takes an int)

ENV_VAR = 'TRANSFORMER_MALLOC'
applied = False  # set by `configure`


def _accelerator_plugin_installed() -> bool:
    """True when a jax GPU plugin (``jax_plugins.*``) or libtpu is installed."""
    if importlib.util.find_spec('libtpu') is not None:
        return True
    try:
        import jax_plugins  # the namespace package jax's GPU plugins install into
    except ImportError:
        return False
    return any(True for _ in pkgutil.iter_modules(jax_plugins.__path__))


def wanted(environ: Mapping[str, str], accelerator_plugin: bool) -> bool:
    """Whether to apply the settings: not opted out, and jax will compute on the CPU."""
    if environ.get(ENV_VAR, '').strip().lower() == 'system':
        return False
    platforms = environ.get('JAX_PLATFORMS', '').strip().lower()
    return platforms == 'cpu' or (not platforms and not accelerator_plugin)


def keep_freed_memory() -> bool:
    """Applies the settings of the module docstring; False where glibc is not the C library."""
    try:
        libc_name = os.confstr('CS_GNU_LIBC_VERSION') or ''
    except (AttributeError, ValueError, OSError):  # no confstr, or a C library without it
        libc_name = ''
    if not sys.platform.startswith('linux') or not libc_name.startswith('glibc'):
        return False
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _KEEP_BYTES))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


def configure() -> bool:
    """`keep_freed_memory` where `wanted`; records and returns whether it was applied."""
    global applied
    applied = wanted(os.environ, _accelerator_plugin_installed()) and keep_freed_memory()
    return applied
