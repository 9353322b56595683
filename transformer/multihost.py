"""Decisions a multi-host run makes once: process 0 decides, every process follows.

Anything that changes control flow (which checkpoint to resume from, whether a validation
score is the best so far, whether to stop early) must come out the same on every process,
or one process enters a collective (a save, a train step) that the others never reach and
the run hangs. Deciding independently from identical inputs would hang the run on two
processes computing a float alike (a sum's order, a library's build). So the value the decision
is made from is computed (or chosen) by process 0 and broadcast, bit for bit; in a
single-process run every function here is the identity.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils


class OtherProcessFailed(RuntimeError):
    """Process 0 failed at a step every process waits for; its own log says why."""


class NotShared(RuntimeError):
    """The processes do not all see the directories process 0 writes into."""


def is_main() -> bool:
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier called ``name``."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _broadcast_int32(values: np.ndarray) -> np.ndarray:
    if jax.process_count() == 1:
        return values
    # The broadcast is a psum of zeros and the source's values: exact for int32.
    return np.asarray(multihost_utils.broadcast_one_to_all(values)).astype(np.int32)


def broadcast_ints(values: Sequence[int]) -> list[int]:
    """Process 0's ``values`` (int32 range) on every process."""
    return [int(v) for v in _broadcast_int32(np.asarray(values, np.int32))]


def broadcast_floats(values: Sequence[float]) -> list[float]:
    """Process 0's ``values`` on every process, exactly (their float64 bits travel)."""
    bits = np.asarray(values, np.float64).view(np.int32)
    return [float(v) for v in _broadcast_int32(bits).view(np.float64)]


def broadcast_bytes(data: bytes) -> bytes:
    """Process 0's ``data`` on every process (e.g. the input process 0 alone read)."""
    if jax.process_count() == 1:
        return data
    (length,) = broadcast_ints([len(data)])
    if not length:
        return b''
    padded = np.zeros(-(-length // 4) * 4, np.uint8)
    if is_main():
        padded[:length] = np.frombuffer(data, np.uint8)
    return _broadcast_int32(padded.view(np.int32)).view(np.uint8)[:length].tobytes()


def all_ok(ok: bool) -> bool:
    """True on every process if ``ok`` on every process, else False on every process."""
    if jax.process_count() == 1:
        return ok
    flags = multihost_utils.process_allgather(np.asarray(ok, np.int32))
    return bool(np.all(np.asarray(flags)))


def on_main(fn: Callable[[], int | None], what: str) -> int | None:
    """Runs ``fn`` on process 0 alone and returns its result (an int >= 0, or None) on every
    process; ``what`` names the work for the other processes' error if it fails there.

    Raises:
      The error of ``fn`` on process 0; `OtherProcessFailed` on the others.
    """
    if jax.process_count() == 1:
        return fn()
    result, error = None, None
    if is_main():
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - re-raised below, once the others know
            error = e
    ok, value = broadcast_ints([error is None, -1 if result is None else result])
    if error is not None:
        raise error
    if not ok:
        raise OtherProcessFailed(f'Process 0 could not {what}; its log says why. Stopped.')
    return None if value < 0 else value


def check_shared(directories: Sequence[str | None], name: str) -> None:
    """That every process sees the same ``directories`` (None entries skipped): process 0
    writes a new random value into the file ``name`` in each, the others must read it back.

    Raises:
      NotShared: on every process, when one of them does not.
    """
    if jax.process_count() == 1:
        return
    directories = list(dict.fromkeys(d for d in directories if d))
    value = secrets.token_hex(16) if is_main() else ''
    if is_main():
        for directory in directories:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
                f.write(value)
    value = broadcast_bytes(value.encode()).decode()

    def sees(directory: str) -> bool:
        try:
            with open(os.path.join(directory, name), encoding='utf-8') as f:
                return f.read() == value
        except OSError:
            return False

    if not all_ok(all(sees(d) for d in directories)):
        raise NotShared(
            f'The processes of this run do not all see the same {" and ".join(directories)}: '
            f'a file process 0 wrote there ({name}) is missing or different on another process. '
            'A multi-host run needs a workdir (and data.cache_dir) on a file system every '
            'process shares (docs/parallelism.md).'
        )
