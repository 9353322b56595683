"""Writing files: whether a directory takes one, and one line for an error of the system.

The commands check where they will write before the work that fills it (a decode of
minutes was lost when its output could not be written at the end), and every command ends
an OSError (a full disk, a read-only directory, a file removed under it) in one line.
"""

from __future__ import annotations

import errno
import tempfile


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
