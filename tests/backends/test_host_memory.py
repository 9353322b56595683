"""transformer/backends/host_memory.py: when the malloc settings apply, and that they keep
memory."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from transformer.backends import host_memory

REPO = pathlib.Path(__file__).parents[2]


@pytest.mark.parametrize(
    ('environ', 'plugin', 'expected'),
    [
        ({}, False, True),  # a CPU-only jax install
        ({}, True, False),  # a GPU / TPU plugin is installed: jax will not compute on the CPU
        ({'JAX_PLATFORMS': 'cpu'}, True, True),
        ({'JAX_PLATFORMS': 'cuda'}, False, False),
        ({'JAX_PLATFORMS': 'cuda,cpu'}, False, False),
        ({'TRANSFORMER_MALLOC': 'system'}, False, False),
        ({'TRANSFORMER_MALLOC': 'System', 'JAX_PLATFORMS': 'cpu'}, False, False),
    ],
)
def test_settings_apply_only_where_jax_computes_on_the_cpu(environ, plugin, expected):
    assert host_memory.wanted(environ, plugin) is expected


# A 256 MB block is allocated, written and freed twice by a thread other than the main one
# (as XLA's workers do); the minor page faults of the second round say whether its pages were
# still mapped.
_SECOND_ROUND_FAULTS = """
import ctypes, json, resource, threading
from transformer.backends import host_memory
host_memory.configure()

libc = ctypes.CDLL('libc.so.6')
libc.malloc.restype = ctypes.c_void_p
size = 256 << 20
faults = []

def rounds():
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(ctypes.c_void_p(block))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=rounds)
thread.start()
thread.join()
pages = size // resource.getpagesize()
print(json.dumps({'pages': pages, 'faults': faults, 'applied': host_memory.applied}))
"""


def _second_round_faults(malloc: str) -> tuple[int, int, bool]:
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'TRANSFORMER_MALLOC': malloc}
    done = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(_SECOND_ROUND_FAULTS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result['faults'][1], result['pages'], result['applied']


@pytest.mark.skipif(
    not sys.platform.startswith('linux') or not hasattr(os, 'confstr'), reason='glibc only'
)
def test_the_settings_keep_a_freed_block_mapped_for_the_next_step():
    """With the settings a block freed by a worker thread is reused without page faults; with
    TRANSFORMER_MALLOC=system glibc unmaps it and every page faults again."""
    if not (os.confstr('CS_GNU_LIBC_VERSION') or '').startswith('glibc'):
        pytest.skip('glibc only')
    kept, pages, applied = _second_round_faults('default')
    unmapped, _, opted_out = _second_round_faults('system')
    assert applied and not opted_out
    assert unmapped > 0.9 * pages
    assert kept < 0.05 * pages


def test_importing_the_package_changes_nothing_and_the_commands_opt_in(monkeypatch):
    """`import transformer` (and its model) sets nothing process-wide; `console.run`, which
    every command goes through, applies the malloc settings before the command's work."""
    code = (
        'import json, sys, transformer, transformer.model\n'
        "print(json.dumps([m in sys.modules for m in ('transformer.backends.host_memory', "
        "'transformer.backends.compile_cache')]))"
    )
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
    done = subprocess.run(
        [sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, False]

    from transformer.commands import console

    order = []
    monkeypatch.setattr(host_memory, 'configure', lambda: order.append('malloc'))
    with pytest.raises(SystemExit) as info:  # absl's app.run exits with main's result
        console.run(lambda argv: order.append('command'), ['command'])
    assert not info.value.code and order == ['malloc', 'command']


# --- how much memory the process may still take: fake /proc and cgroup trees ---------------

GiB = 2**30
V1_NONE = 9223372036854771712  # cgroup v1's "no limit"
V1_MOUNT = '35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory'
V2_MOUNT = '41 23 0:38 / /sys/fs/cgroup{under} rw,relatime - cgroup2 cgroup2 rw'


def _tree(root, cgroup: str, mountinfo: list[str], files: dict, available_kib=20 * 2**20):
    """A /proc/self/cgroup, /proc/self/mountinfo, /proc/meminfo and cgroup files under
    ``root``; ``files``: {path: content}."""
    files = {
        'proc/self/cgroup': cgroup,
        'proc/self/mountinfo': '\n'.join(mountinfo),
        'proc/meminfo': f'MemTotal:       {2 * available_kib} kB\n'
        f'MemAvailable:   {available_kib} kB\n',
        **files,
    }
    for path, content in files.items():
        if content is None:
            continue
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f'{content}\n')
    return str(root)


def test_cgroup_v1_limit_minus_usage_up_the_ancestors(tmp_path):
    memory = 'sys/fs/cgroup/memory'
    root = _tree(
        tmp_path,
        '5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n',
        [V1_MOUNT.format(root='/')],
        {
            f'{memory}/docker/abc/memory.limit_in_bytes': 4 * GiB,
            f'{memory}/docker/abc/memory.usage_in_bytes': 1 * GiB,
            f'{memory}/docker/memory.limit_in_bytes': V1_NONE,  # no limit
            f'{memory}/docker/memory.usage_in_bytes': 10 * GiB,
            f'{memory}/memory.limit_in_bytes': V1_NONE,
            f'{memory}/memory.usage_in_bytes': 15 * GiB,
        },
    )
    where = f'/{memory}/docker/abc'
    assert host_memory.cgroup_room(root) == (3 * GiB, f'{tmp_path}{where}')
    assert host_memory.available(root) == (3 * GiB, f'the limit minus the usage of cgroup {where}')
    assert host_memory.mem_available(root) == 20 * GiB


def test_cgroup_v1_nested_limit_of_an_ancestor_decides(tmp_path):
    memory = 'sys/fs/cgroup/memory'
    root = _tree(
        tmp_path,
        '4:memory:/jobs/one\n',
        [V1_MOUNT.format(root='/')],
        {
            f'{memory}/jobs/one/memory.limit_in_bytes': 8 * GiB,
            f'{memory}/jobs/one/memory.usage_in_bytes': 1 * GiB,
            f'{memory}/jobs/memory.limit_in_bytes': 6 * GiB,  # shared with other jobs
            f'{memory}/jobs/memory.usage_in_bytes': 5 * GiB,
        },
    )
    assert host_memory.available(root) == (
        GiB,
        f'the limit minus the usage of cgroup /{memory}/jobs',
    )


def test_cgroup_v1_mounted_from_the_containers_own_cgroup(tmp_path):
    """A container sees its cgroup's path in /proc/self/cgroup and that same cgroup mounted as
    the hierarchy's root (mountinfo's root field): the files are at the mount point."""
    memory = 'sys/fs/cgroup/memory'
    root = _tree(
        tmp_path,
        '4:memory:/docker/abc\n',
        [V1_MOUNT.format(root='/docker/abc')],
        {f'{memory}/memory.limit_in_bytes': 2 * GiB, f'{memory}/memory.usage_in_bytes': 3 * GiB},
    )
    assert host_memory.available(root) == (0, f'the limit minus the usage of cgroup /{memory}')


def test_cgroup_v2_max_means_no_limit_and_a_parent_limit_decides(tmp_path):
    unified = 'sys/fs/cgroup'
    root = _tree(
        tmp_path,
        '0::/user.slice/job.scope\n',
        [V2_MOUNT.format(under='')],
        {
            f'{unified}/user.slice/job.scope/memory.max': 'max',
            f'{unified}/user.slice/job.scope/memory.current': 3 * GiB,
            f'{unified}/user.slice/memory.max': 16 * GiB,
            f'{unified}/user.slice/memory.current': 12 * GiB,
        },
    )
    assert host_memory.available(root) == (
        4 * GiB,
        f'the limit minus the usage of cgroup /{unified}/user.slice',
    )
    (tmp_path / unified / 'user.slice/memory.max').write_text('max\n')
    assert host_memory.cgroup_room(root) is None
    assert host_memory.available(root) == (20 * GiB, 'MemAvailable in /proc/meminfo')


def test_hybrid_v1_and_v2_take_the_least_room(tmp_path):
    """systemd's hybrid layout: the v1 memory controller and a v2 tree without it."""
    root = _tree(
        tmp_path,
        '4:memory:/a\n0::/b\n',
        [V1_MOUNT.format(root='/'), V2_MOUNT.format(under='/unified')],
        {
            'sys/fs/cgroup/memory/a/memory.limit_in_bytes': 9 * GiB,
            'sys/fs/cgroup/memory/a/memory.usage_in_bytes': 2 * GiB,
            'sys/fs/cgroup/unified/b/memory.max': 6 * GiB,
            'sys/fs/cgroup/unified/b/memory.current': 1 * GiB,
        },
    )
    assert host_memory.cgroup_room(root) == (5 * GiB, f'{tmp_path}/sys/fs/cgroup/unified/b')


def test_no_cgroup_leaves_mem_available_and_nothing_leaves_none(tmp_path):
    root = _tree(tmp_path, None, [], {}, available_kib=2**20)
    (tmp_path / 'proc/self/cgroup').unlink(missing_ok=True)
    assert host_memory.cgroup_room(root) is None
    assert host_memory.available(root) == (GiB, 'MemAvailable in /proc/meminfo')
    (tmp_path / 'proc/meminfo').unlink()
    assert host_memory.available(root) is None
    assert host_memory.available(str(tmp_path / 'nothing')) is None


def test_this_machine_says_how_much_memory_is_left():
    """On Linux /proc/meminfo has MemAvailable (since 3.14): a figure, at most the RAM."""
    if not sys.platform.startswith('linux'):
        pytest.skip('reads /proc')
    free, where = host_memory.available()
    assert 0 < free <= os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') and where
