"""What benchmarks/multi30k_sweep.py needs besides its plan: processes run side by side until a
deadline, what a run's own logs say of its speed, and mean +- std over seeds.

Nothing here imports jax: the sweep's own process never touches the device its trainings and
decodes share.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, NamedTuple

# What train.py writes once its first step has compiled (transformer/training/parallel.py).
COMPILED = re.compile(r'Compiled the training step in ([0-9.]+) s')
# Its console line of each logged step: 'step N/TOTAL ...' (transformer/training/metrics.py).
STEP_LINE = re.compile(r'\bstep (\d+)/(\d+)\b')


class Job(NamedTuple):
    command: list[str]
    log: pathlib.Path  # stdout and stderr, appended


class Done(NamedTuple):
    returncode: int | None  # None: never ended, even killed (should not happen)
    seconds: float  # from the start of all jobs to this one's end
    stopped: bool  # sent SIGINT at the stop time


def _answering_sigint(command: list[str]) -> list[str]:
    """``command`` started with SIGINT's default action. A shell starts a background command
    (`nohup ... &`) with SIGINT ignored, which its children would inherit (an ignored signal
    stays ignored across exec), and then the stop time could not stop them. A small Python
    restores the default and becomes ``command`` (exec keeps the pid, so the SIGINT sent to it
    reaches the job); no ``preexec_fn``, which forks and runs Python in the child, a deadlock
    risk when the caller runs threads (jax does). The caller starts it with SIGINT blocked
    (`_started`): a SIGINT sent before the default is restored stays pending (an ignored one
    would be lost) and ends the job when the small Python unblocks it."""
    restore = (
        'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); '
        'signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); '
        'os.execvp(sys.argv[1], sys.argv[1:])'
    )
    return [sys.executable, '-c', restore, *command]


def _started(command: list[str], **popen) -> subprocess.Popen:
    """``command`` started by `_answering_sigint` with SIGINT blocked in this thread meanwhile
    (a child inherits the mask of the thread that starts it; this thread's is restored)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen(_answering_sigint(command), **popen)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def run_all(
    jobs: dict[Any, Job],
    *,
    cwd: pathlib.Path,
    env: dict[str, str],
    stop_at: float = math.inf,
    grace_s: float = 60.0,
    poll_s: float = 0.5,
) -> dict[Any, Done]:
    """Starts every job at once and waits for them; at ``stop_at`` (a `time.time()`) the ones
    still running get SIGINT, which train.py answers by finishing the checkpoint in flight and
    exiting (Ctrl-C), half of ``grace_s`` later a second SIGINT (Python loses a
    KeyboardInterrupt raised inside a garbage-collection callback, which jax installs: seen
    while a job imported jax), and ``grace_s`` later SIGKILL. The jobs answer SIGINT even when
    the sweep itself ignores it (started in the background: `nohup ... &`)."""
    start, procs, logs = time.time(), {}, []
    try:
        for key, job in jobs.items():
            log = open(job.log, 'a')  # noqa: SIM115 - closed below
            logs.append(log)
            # Where this run's lines begin in a log that earlier runs appended to.
            log.write(f'=== {time.strftime("%Y-%m-%d %H:%M:%S")} {" ".join(job.command)}\n')
            log.flush()
            procs[key] = _started(job.command, cwd=cwd, env=env, stdout=log, stderr=log)
        done: dict[Any, Done] = {}
        signals = [(stop_at, signal.SIGINT), (stop_at + grace_s / 2, signal.SIGINT)]
        signals.append((stop_at + grace_s, signal.SIGKILL))
        while len(done) < len(procs):
            now, stopped = time.time(), len(signals) < 3  # SIGINT sent
            for key, proc in procs.items():
                if key not in done and proc.poll() is not None:
                    done[key] = Done(proc.returncode, now - start, stopped)
            while signals and now >= signals[0][0]:
                for key, proc in procs.items():
                    if key not in done:
                        proc.send_signal(signals[0][1])
                signals.pop(0)
            time.sleep(poll_s if len(done) < len(procs) else 0)
        return done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()


def last_line(path: pathlib.Path) -> str:
    """The last non-blank line of a log ('' without one): what a failed process said last."""
    try:
        lines = [line for line in path.read_text(errors='replace').splitlines() if line.strip()]
    except OSError:
        return ''
    return lines[-1] if lines else ''


def training_speed(log: pathlib.Path, workdir: pathlib.Path) -> dict[str, float | int | None]:
    """A run's speed as its own logs give it.

    ``compile_s``: train.py's "Compiled the training step in X s" (the last one in ``log``,
    which a rerun appends to). ``steps_per_s``: the median of the ``steps_per_s`` of the train
    records of WORKDIR/metrics.jsonl after the first, whose interval holds the compilation (all
    of them when there is one). ``planned_steps``: the TOTAL of the console's 'step N/TOTAL'.
    """
    text = log.read_text(errors='replace') if log.exists() else ''
    compiled = COMPILED.findall(text)
    steps = STEP_LINE.findall(text)
    speeds = []
    jsonl = workdir / 'metrics.jsonl'
    if jsonl.exists():
        for line in jsonl.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get('split') == 'train' and 'steps_per_s' in record:
                speeds.append(record['steps_per_s'])
    return {
        'compile_s': float(compiled[-1]) if compiled else None,
        'steps_per_s': statistics.median(speeds[1:] or speeds) if speeds else None,
        'planned_steps': int(steps[-1][1]) if steps else None,
    }


def last_checkpoint(workdir: pathlib.Path) -> int | None:
    """The newest step saved in WORKDIR/checkpoints (transformer/rundir.py: a directory named
    by its step), None without one; read without Orbax, which would import jax."""
    steps = [int(p.name) for p in (workdir / 'checkpoints').glob('*') if p.name.isdigit()]
    return max(steps, default=None)


def summary(values: list[float]) -> dict[str, Any]:
    """{'values', 'n', 'mean', 'std'}: the sample standard deviation (ddof=1), None below 2."""
    return {
        'values': values,
        'n': len(values),
        'mean': statistics.mean(values) if values else None,
        'std': statistics.stdev(values) if len(values) > 1 else None,
    }


def mean_std(s: dict[str, Any]) -> str:
    """'41.02 +- 0.31 (n=3)' of a `summary`."""
    if not s['n']:
        return '- (n=0)'
    std = f' +- {s["std"]:.2f}' if s['std'] is not None else ''
    return f'{s["mean"]:.2f}{std} (n={s["n"]})'


def memory_fraction(processes: int, env: dict[str, str]) -> dict[str, str]:
    """``env`` with each of ``processes`` given an equal share of a GPU's memory
    (XLA_PYTHON_CLIENT_MEM_FRACTION = 0.9 / processes) unless the caller set one."""
    env = dict(env)
    if 'XLA_PYTHON_CLIENT_MEM_FRACTION' not in os.environ:
        env['XLA_PYTHON_CLIENT_MEM_FRACTION'] = f'{0.9 / max(processes, 1):.3f}'
    return env
