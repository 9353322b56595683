"""Lines of text from bytes that may be hostile: one sentence a line, whatever the file holds.

Shared by the folder dataset and the translate command, so that both read a file the same
way: lines end at ``\\n`` only (``str.splitlines`` would also split at form feeds, ``\\x1c``
and U+2028 and so break the one-line-per-sentence alignment), a ``\\r`` before it is part of
the line end (CRLF files), a missing final newline changes nothing, invalid UTF-8 becomes
U+FFFD, and control characters (NUL included; tab is kept) become spaces. Each changed line
gets a warning with its line number (the first `MAX_WARNINGS`, then a count).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from absl import logging

MAX_WARNINGS = 20
# C0 controls but tab and newline, DEL and the C1 controls (NEL, ...).
_CONTROL = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f]')


class LineCleaner:
    """Cleans the lines of one file or stream, one at a time, as the module docstring says,
    warning about the first `MAX_WARNINGS` changed lines (`finish` reports the rest)."""

    def __init__(self, name: str):
        self.name = name  # a path, or ``stdin``
        self.changed = 0

    def clean(self, line: bytes, number: int) -> str:
        """Line ``number`` (1-based), without its ``\\n``, as text."""
        if line.endswith(b'\r'):
            line = line[:-1]
        problems = []
        try:
            text = line.decode('utf-8')
        except UnicodeDecodeError:
            text = line.decode('utf-8', errors='replace')
            problems.append('invalid UTF-8 replaced with U+FFFD')
        cleaned = _CONTROL.sub(' ', text)
        if cleaned != text:
            problems.append('control characters replaced with spaces')
        if problems:
            self.changed += 1
            if self.changed <= MAX_WARNINGS:
                logging.warning('%s line %d: %s.', self.name, number, '; '.join(problems))
        return cleaned

    def finish(self) -> None:
        """Counts the changed lines that were not listed."""
        if self.changed > MAX_WARNINGS:
            logging.warning(
                '%s: %d more changed lines not listed (%d in all).',
                self.name,
                self.changed - MAX_WARNINGS,
                self.changed,
            )


def decode_lines(data: bytes, name: str) -> list[str]:
    """The lines of ``data`` as text, cleaned as the module docstring says.

    Args:
      data: the raw bytes of a file or of stdin.
      name: what to call them in warnings (a path, or ``stdin``).

    Returns:
      One string per line, without line ends.
    """
    raw = data.split(b'\n')
    if raw and not raw[-1]:
        raw.pop()  # the final newline ends the last line; it does not start another
    cleaner = LineCleaner(name)
    lines = [cleaner.clean(line, number) for number, line in enumerate(raw, start=1)]
    cleaner.finish()
    return lines


def read_lines(path: str, name: str | None = None) -> Iterator[str]:
    """The lines of the file ``path``, cleaned as `decode_lines` cleans them, one at a time:
    a file of any size in the memory of one line."""
    cleaner = LineCleaner(name or path)
    with open(path, 'rb') as f:
        for number, line in enumerate(f, start=1):
            yield cleaner.clean(line[:-1] if line.endswith(b'\n') else line, number)
    cleaner.finish()
