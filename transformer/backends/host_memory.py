"""The host's memory: how much this process may still take (`available`), and glibc malloc
settings that keep a CPU training step's buffers mapped between steps (`configure`).

`available` is the smallest of the kernel's estimate of what can be allocated without
swapping (``MemAvailable`` in /proc/meminfo, Linux >= 3.14) and, for this process's memory
cgroup and each of its ancestors, the limit minus the usage (cgroup v1 ``memory.limit_in_bytes``
/ ``memory.usage_in_bytes``, v2 ``memory.max`` / ``memory.current``): a container's limit is
usually below what the host has free, and a process past it is killed by the kernel without
a message. Training compares it with XLA's memory analysis of the compiled step before the
step runs (transformer/training/footprint.py, `step_refusal`).

The malloc settings. On a CPU, every execution of a compiled step asks for its temporaries
in one block (548 MB for a `configs/multi30k.py` step), and XLA's worker threads allocate it
with glibc's ``malloc``. A thread other than the main one allocates from a secondary arena,
which serves blocks that large with a fresh ``mmap`` and returns them with ``munmap`` however
glibc's thresholds are set, so every step page-faults its way through the whole block again: ~2.9M
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


# --- how much memory this process may still take ----------------------------------------------

# cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712); any
# figure this large is taken as none.
_NO_LIMIT = 2**62
# Per hierarchy: (limit file, usage file, the value that means "no limit").
_V1 = ('memory.limit_in_bytes', 'memory.usage_in_bytes', None)
_V2 = ('memory.max', 'memory.current', 'max')


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip('/'))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def mem_available(root: str = '/') -> int | None:
    """``MemAvailable`` of ``root``/proc/meminfo in bytes (None where it is missing)."""
    for line in (_read(_under(root, 'proc/meminfo')) or '').splitlines():
        name, _, value = line.partition(':')
        if name == 'MemAvailable' and value.split()[:1] and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024  # the file says kB and means KiB
    return None


def _memory_cgroups(root: str) -> list[tuple[str, str, tuple[str, str, str | None]]]:
    """(directory of this process's memory cgroup, its hierarchy's mount point, files) for
    the v1 memory hierarchy and the v2 unified one, where mounted."""
    groups = {}  # 'v1' / 'v2' -> this process's path in that hierarchy
    for line in (_read(_under(root, 'proc/self/cgroup')) or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        if parts[0] == '0' and parts[1] == '':
            groups['v2'] = parts[2]
        elif 'memory' in parts[1].split(','):
            groups['v1'] = parts[2]
    found = []
    for line in (_read(_under(root, 'proc/self/mountinfo')) or '').splitlines():
        fields = line.split()
        if ' - ' not in line or len(fields) < 5:
            continue
        fstype, _, options = line.split(' - ', 1)[1].partition(' ')
        mount_root, mount_point = fields[3], fields[4]
        if fstype == 'cgroup2' and 'v2' in groups:
            version, files = 'v2', _V2
        elif fstype == 'cgroup' and 'memory' in options.split()[-1].split(',') and 'v1' in groups:
            version, files = 'v1', _V1
        else:
            continue
        path = groups.pop(version)
        # A mount of a sub-tree (a container's own cgroup) holds the paths below its root.
        if mount_root != '/' and (path + '/').startswith(mount_root.rstrip('/') + '/'):
            path = path[len(mount_root.rstrip('/')) :]
        found.append((_under(root, mount_point + path), _under(root, mount_point), files))
    return found


def cgroup_room(root: str = '/') -> tuple[int, str] | None:
    """The least room (limit minus usage) over this process's memory cgroups and their
    ancestors, with the cgroup directory that sets it; None where no level has a limit."""
    least = None
    for directory, top, (limit_file, usage_file, none) in _memory_cgroups(root):
        directory, top = os.path.normpath(directory), os.path.normpath(top)
        while True:
            limit = _read(os.path.join(directory, limit_file))
            usage = _read(os.path.join(directory, usage_file))
            if limit and limit != none and limit.isdigit() and int(limit) < _NO_LIMIT:
                room = int(limit) - (int(usage) if usage and usage.isdigit() else 0)
                if least is None or room < least[0]:
                    least = (max(0, room), directory)
            if not directory.startswith(top + os.sep):  # the hierarchy's root is done
                break
            directory = os.path.dirname(directory)
    return least


def available(root: str = '/') -> tuple[int, str] | None:
    """The memory this process may still take, in bytes, and what sets it: the smallest of
    `mem_available` and `cgroup_room`; None where neither is known (not Linux)."""
    candidates = []
    if (free := mem_available(root)) is not None:
        candidates.append((free, 'MemAvailable in /proc/meminfo'))
    if (room := cgroup_room(root)) is not None:
        directory = '/' + os.path.relpath(room[1], root)
        candidates.append((room[0], f'the limit minus the usage of cgroup {directory}'))
    return min(candidates) if candidates else None
