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

from absl import logging

MAX_WARNINGS = 20
# C0 controls but tab and newline, DEL and the C1 controls (NEL, ...).
_CONTROL = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f]')


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
    lines, changed = [], 0
    for number, line in enumerate(raw, start=1):
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
            changed += 1
            if changed <= MAX_WARNINGS:
                logging.warning('%s line %d: %s.', name, number, '; '.join(problems))
        lines.append(cleaned)
    if changed > MAX_WARNINGS:
        logging.warning(
            '%s: %d more changed lines not listed (%d in all).',
            name,
            changed - MAX_WARNINGS,
            changed,
        )
    return lines
