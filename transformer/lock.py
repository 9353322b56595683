"""One training process per workdir: ``WORKDIR/train.lock``, held while a run trains.

Two ``train.py`` on one workdir would interleave their checkpoints, metrics and config;
the second one to start stops in one line naming the first (its pid and host). The lock is
an advisory ``flock`` on the file, which the kernel releases when the process ends however
it ends (SIGKILL included), so a stale file never blocks a rerun. In a multi-host run only
process 0 takes it (the others write no run files of their own).
"""

from __future__ import annotations

import fcntl
import os
import socket
from typing import TextIO

import jax

LOCK_FILE = 'train.lock'


class WorkdirBusy(RuntimeError):
    """Another process is training in this workdir."""


def acquire(workdir: str) -> TextIO | None:
    """Takes ``WORKDIR/train.lock`` (None in processes other than 0); `release` gives it back.

    Raises:
      WorkdirBusy: another process holds it.
    """
    if jax.process_index() != 0:
        return None
    handle = open(os.path.join(workdir, LOCK_FILE), 'a+')
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or 'another process'
        handle.close()
        raise WorkdirBusy(
            f'{workdir} is in use by another training run ({holder}); wait for it to end, '
            'or train in another --workdir.'
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f'pid {os.getpid()} on {socket.gethostname()}\n')
    handle.flush()
    return handle


def release(handle: TextIO | None) -> None:
    """Gives the lock back (closing the file releases the flock)."""
    if handle is not None:
        handle.close()


def remove_unused(workdir: str) -> None:
    """Removes ``workdir`` if it holds nothing but an unheld ``train.lock``: what a run that
    stopped during set-up leaves in a directory it made itself."""
    try:
        if os.listdir(workdir) == [LOCK_FILE]:
            os.remove(os.path.join(workdir, LOCK_FILE))
            os.rmdir(workdir)
    except OSError:
        pass  # something else appeared there, or it is not ours to remove: leave it
