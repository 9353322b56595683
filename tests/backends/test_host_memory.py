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
