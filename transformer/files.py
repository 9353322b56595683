"""Writing files: whether a directory takes one, a directory put in place whole, and one line
for an error of the system.

The commands check where they will write before the work that fills it (a decode of
minutes was lost when its output could not be written at the end), and every command ends
an OSError (a full disk, a read-only directory, a file removed under it) in one line.

A directory a command makes whole (an export, a converted run) is written into a temporary
sibling and renamed into place (`write_in_place`), so a failure leaves the target as it was.
It replaces only a directory that the same command wrote: one holding its `Mark`, a JSON
file naming the command and every file it wrote, and nothing else.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any


def unwritable(directory: str) -> str | None:
    """Why no file can be created in ``directory`` (None: one can). A file is created and
    removed to know: permission bits do not stop root, and a read-only mount stops everyone."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


# Errors of writing that no retry mends: the line says which file and why.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def os_error_line(error: OSError) -> str:
    """One line for an OSError: what the system said and the file it names."""
    where = error.filename if error.filename is not None else ''
    reason = error.strerror or str(error)
    if error.errno in _WRITE_ERRNOS:
        return f'cannot write {where or "a file"}: {reason}.'
    return f'{reason}: {where}' if where else reason


class NotReplaceable(RuntimeError):
    """A target directory that a command may not replace; one line saying why."""


@dataclasses.dataclass(frozen=True)
class Mark:
    """The file (``name``) a command writes into a directory it makes, holding ``written_by``
    (the command), ``details`` (what it wrote: a format, a run, steps) and the list of every
    file it wrote: what lets a later run of the same command replace that directory."""

    name: str
    written_by: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def read(self, directory: str) -> dict[str, Any] | None:
        """The mark in ``directory`` when ``written_by`` wrote it (None: absent, unreadable, or
        another writer's)."""
        try:
            with open(os.path.join(directory, self.name), encoding='utf-8') as f:
                found = json.load(f)
        except (OSError, ValueError):
            return None
        ok = isinstance(found, dict) and found.get('written_by') == self.written_by
        return found if ok and isinstance(found.get('files'), list) else None

    def foreign(self, directory: str) -> list[str] | None:
        """The files of ``directory`` its mark does not list (sorted, relative); None without a
        mark of ``written_by``."""
        found = self.read(directory)
        if found is None:
            return None
        listed = {*map(str, found['files']), self.name}
        return [name for name in tree_files(directory) if name not in listed]

    def write(self, directory: str) -> None:
        """The mark, listing every file ``directory`` holds now."""
        value = {'written_by': self.written_by, **self.details, 'files': tree_files(directory)}
        with open(os.path.join(directory, self.name), 'w', encoding='utf-8') as f:
            json.dump(value, f, indent=2)
            f.write('\n')


def tree_files(directory: str) -> list[str]:
    """Every file (and link, and empty directory) under ``directory``, relative, sorted."""
    found = []
    for root, dirs, names in os.walk(directory):
        relative = os.path.relpath(root, directory)
        entries = names + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        entries += [d for d in dirs if not os.listdir(os.path.join(root, d))]
        found += [os.path.normpath(os.path.join(relative, name)) for name in entries]
    return sorted(set(found))


def replace_refusal(target: str, mark: Mark | None) -> str | None:
    """Why ``write_in_place`` may not put a directory at ``target`` (None: absent, an empty
    directory, or, with ``mark``, a directory that its writer made and nothing else is in)."""
    if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
        return f'{target} is {"a link" if os.path.islink(target) else "a file"}, not a directory'
    if not os.path.isdir(target) or not os.listdir(target):
        return None
    foreign = mark.foreign(target) if mark else None
    if foreign is None:
        return f'{target} exists and is not empty'
    if foreign:
        shown = ', '.join(foreign[:3]) + (f' and {len(foreign) - 3} more' if foreign[3:] else '')
        return f'{target} holds files that {mark.written_by} did not write ({shown})'
    return None


def write_in_place(
    target: str, build: Callable[[str], str], *, mark: Mark | None = None, replace: bool = False
) -> None:
    """Puts the directory ``build(scratch)`` returns at ``target``, whole or not at all.

    ``build`` writes into ``scratch``, a new temporary sibling of ``target`` (same file system:
    the rename is atomic), and returns the directory it made inside it. With ``mark`` that
    directory gets the mark (`Mark.write`). The target may be absent or an empty directory;
    with ``replace`` also a directory ``mark``'s writer made (`replace_refusal`, checked again
    before the rename), which is moved aside, then removed once the new one is in place. A
    failure anywhere leaves ``target`` as it was and removes the scratch directory.

    Raises:
      NotReplaceable: ``target`` holds something else, before anything is written.
    """
    target = os.path.abspath(target)
    parent, name = os.path.split(target)

    def check():
        problem = replace_refusal(target, mark if replace else None)
        if problem:
            raise NotReplaceable(problem)

    check()
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(dir=parent, prefix=f'.{name}.tmp-')
    try:
        built = build(scratch)
        if mark is not None:
            mark.write(built)
        check()  # what the target holds now, after the minutes the build took
        old = os.path.join(tempfile.mkdtemp(dir=scratch), 'old')
        if os.path.isdir(target) and os.listdir(target):
            os.rename(target, old)
        try:
            os.rename(built, target)  # onto an absent or an empty directory
        except OSError:
            if os.path.isdir(old):
                os.rename(old, target)  # the previous one stays, not the scratch directory
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
