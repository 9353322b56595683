"""jax's persistent compilation cache, on by default for the commands.

Every command compiles its programs when it starts: the training and evaluation steps, and one
decoding loop per batch shape (three with the shrinking batch, `next_token.shrinking_loop`).
On a 2-core CPU that is most of a short command's time, and the same programs are compiled
again by the next command on the same run. jax can keep compiled programs on disk and load
them instead; `console.run` (every command) calls `configure` before the command compiles
anything, so that only the first command of a kind pays.

Where the cache lives:

* ``JAX_COMPILATION_CACHE_DIR`` (jax's own setting) wins when it is set;
* else ``TRANSFORMER_COMPILATION_CACHE``: a directory, or ``off`` for no cache;
* else ``$XDG_CACHE_HOME/transformer/jax/<host>`` (``~/.cache`` without XDG_CACHE_HOME).

``<host>`` names the machine type and a hash of the CPU model and its instruction-set flags:
jax's cache key names the platform ('cpu') but not the CPU, and a program compiled for one
CPU's instructions must not be loaded on a host without them (a home directory shared by
several kinds of machine). The cache holds at most `MAX_BYTES` unless
``JAX_COMPILATION_CACHE_MAX_SIZE`` says otherwise (jax drops the least recently used
programs; it needs the ``filelock`` package for that, without which the cache is
unlimited). A cache that cannot be created is a one-line warning, never a failed command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform

import jax
from absl import logging

ENV_VAR = 'TRANSFORMER_COMPILATION_CACHE'
OFF = ('off', 'none', '0', 'false', 'no')
MAX_BYTES = 2 << 30


def host_tag(cpuinfo: str = '/proc/cpuinfo') -> str:
    """``<machine>-<12 hex digits>``: the machine type and a hash of the CPU's model name and
    instruction-set flags (the first processor of ``cpuinfo``; `platform.processor()` where
    there is none). The clock speed and the like are left out: they change, the instructions
    a program may use do not."""
    info = platform.processor()
    try:
        with open(cpuinfo, encoding='utf-8', errors='replace') as f:
            first = f.read().split('\n\n', 1)[0]
        keep = ('model name', 'flags', 'Features', 'CPU implementer', 'CPU part')
        info = '\n'.join(line for line in first.splitlines() if line.startswith(keep)) or info
    except OSError:
        pass
    return f'{platform.machine() or "unknown"}-{hashlib.sha256(info.encode()).hexdigest()[:12]}'


def default_dir() -> str:
    """``$XDG_CACHE_HOME/transformer/jax/<host_tag>`` (``~/.cache`` without XDG_CACHE_HOME)."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'transformer', 'jax', host_tag())


def configure() -> str | None:
    """Turns the cache on for this process as the module docstring says; returns its
    directory, or None when it is off. Call it before the process's first compilation:
    jax opens the cache once, at the first compilation that may use it."""
    current = jax.config.jax_compilation_cache_dir
    if current:  # JAX_COMPILATION_CACHE_DIR, or the process chose one itself
        return current
    setting = os.environ.get(ENV_VAR, '').strip()
    if setting.lower() in OFF:
        return None
    path = os.path.abspath(os.path.expanduser(setting)) if setting else default_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        logging.warning(
            'No compilation cache: cannot create %s (%s). Set %s to a writable directory, '
            'or to off.',
            path,
            e.strerror or e,
            ENV_VAR,
        )
        return None
    jax.config.update('jax_compilation_cache_dir', path)
    # jax's default is no limit. It enforces one with the filelock package (a dependency of
    # ours); without it, a limit would fail the first compilation, so the cache stays unlimited.
    limited = importlib.util.find_spec('filelock') is not None
    if jax.config.jax_compilation_cache_max_size == -1 and limited:
        jax.config.update('jax_compilation_cache_max_size', MAX_BYTES)
    return path
