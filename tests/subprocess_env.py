"""The environment of a process a test starts: this one's, with the repository first on
PYTHONPATH (and what was there kept: packages may be installed through it)."""

import os
import pathlib
import sys

from tests.compiles import OLDER_GENERATORS_FLAG

REPO = str(pathlib.Path(__file__).resolve().parents[1])


def repo_env(**overrides: str) -> dict[str, str]:
    """os.environ with REPO prepended to PYTHONPATH, then ``overrides``."""
    path = [REPO, *filter(None, os.environ.get('PYTHONPATH', '').split(os.pathsep))]
    return {**os.environ, 'PYTHONPATH': os.pathsep.join(path), **overrides}


def xla_flags(devices: int) -> str:
    """This process's ``XLA_FLAGS`` (tests/conftest.py's) for a process with ``devices`` CPU
    devices instead of 8: the same compiler settings as the computations it is compared with.
    A process of one device compiles every program by XLA's older CPU code generators, as the
    test processes compile their one-device programs (tests/compiles.py)."""
    flags = os.environ.get('XLA_FLAGS', '').split()
    count = '--xla_force_host_platform_device_count'
    flags = [*(f for f in flags if not f.startswith(count)), f'{count}={devices}']
    if devices == 1:
        flags.append(f'--{OLDER_GENERATORS_FLAG}=false')
    return ' '.join(flags)


def memory_capped(command: list[str], gib: int) -> list[str]:
    """``command`` run with its address space capped at ``gib`` GiB: an allocation past it
    fails in the child (jax's RESOURCE_EXHAUSTED) on every machine, where without it a machine
    that overcommits memory grants it and the kernel kills the child once it is touched. The
    cap is set by a Python that then becomes ``command`` (limits survive exec), not by a
    ``preexec_fn`` (forking a multithreaded jax process can deadlock)."""
    cap = (
        'import os, resource, sys; limit = int(sys.argv[1]); '
        'resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); '
        'os.execv(sys.argv[2], sys.argv[2:])'
    )
    return [sys.executable, '-c', cap, str(gib * 2**30), *command]
