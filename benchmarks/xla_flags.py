"""XLA flag sets timed in processes of their own, for benchmarks/step_variants.py ``--flags``.

XLA reads ``XLA_FLAGS`` once, when jax starts its first backend, and a name it does not know
stops the process ("Unknown flag in XLA_FLAGS"). So a flag set is first given to a child that
only starts jax's CPU backend (`known`: the flags are parsed whatever the backend, and the
child never touches the GPU another process holds), then to a child that times the default
step with it (`time_default`).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parent / 'step_variants.py'
_START_JAX = 'import jax.numpy as jnp; jnp.zeros(1).block_until_ready()'


def with_flags(flags: str, **more: str) -> dict[str, str]:
    """This process's environment with ``flags`` added to ``XLA_FLAGS`` (and ``more``)."""
    env = {**os.environ, **more}
    env['XLA_FLAGS'] = f'{env.get("XLA_FLAGS", "")} {flags}'.strip()
    return env


def known(flags: str, timeout_s: float = 120.0) -> str | None:
    """None if this jax's XLA accepts ``flags``; else the line its child died with."""
    env = with_flags(flags, JAX_PLATFORMS='cpu')
    try:
        done = subprocess.run(
            [sys.executable, '-c', _START_JAX],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f'a process with XLA_FLAGS="{flags}" did not start jax in {timeout_s:.0f} s'
    if done.returncode == 0:
        return None
    said = [line for line in done.stderr.splitlines() if line.strip()]
    return said[-1].strip() if said else f'exit code {done.returncode}'


def time_default(argv: list[str], flags: str, timeout_s: float, mem_fraction: str) -> dict | str:
    """The default step's row of step_variants.py run with ``argv`` (its config, settings,
    steps and rounds) in a child whose ``XLA_FLAGS`` include ``flags``; the child's error line
    (a string) where it fails or runs out of time."""
    with tempfile.TemporaryDirectory(prefix='variants-flags-') as out:
        cmd = [sys.executable, str(SCRIPT), *argv, '--only_default', '--flags', '--profile_steps=0']
        cmd += [f'--out={out}', f'--deadline_s={max(1, int(timeout_s) - 10)}']
        env = with_flags(flags, XLA_PYTHON_CLIENT_MEM_FRACTION=mem_fraction)
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f'ran past {timeout_s:.0f} s'
        report = pathlib.Path(out, 'variants.json')
        if done.returncode or not report.exists():
            said = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            return said[-1].strip() if said else f'exit code {done.returncode}'
        return json.loads(report.read_text())['variants'][0]
