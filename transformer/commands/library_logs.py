"""The libraries' log lines at the console: our progress lines, not the libraries' chatter.

By default (absl's ``--verbosity=0``) the terminal shows this package's INFO lines and the
libraries' warnings and errors, each on one line (without its traceback), minus a few lines
every run would print and no user can act on (`NOISE`): jax's TPU probe, Orbax's notes on
the read-only checkpoint managers that evaluate / translate use, sacreBLEU's guess that
tokenized-looking text (the synthetic task, Moses-style references) was not detokenized,
asyncio's and tensorstore's reports at exit on the tasks of a failed Orbax save or restore
('... exception was never retrieved', 'Event loop is closed'), and ml_collections'
``load_module`` DeprecationWarning. ``--verbosity=1`` (``-v 1``) shows everything.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from absl import logging

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Library lines that are dropped at the default verbosity (matched anywhere in the message).
NOISE = (
    "Unable to initialize backend 'tpu'",
    "Platform 'tpu' is experimental",
    'CheckpointManagerOptions.read_only=True, setting',
    'Given directory is read only',
    "That's 100 lines that end in a tokenized period",
    'It looks like you forgot to detokenize your test data',
    'If you insist your data is detokenized',
    # asyncio, at exit, for the tasks of a failed Orbax save whose error was already reported.
    'exception was never retrieved',
    # ml_collections, for a config file whose get_config() returns None: the train command's
    # own line names the file.
    'did you forget a return statement?',
)
_NOISE_RE = re.compile('|'.join(re.escape(line) for line in NOISE))
# ml_collections loads config files with the deprecated loader.load_module().
_DEPRECATION = r'.*load_module\(\) method is deprecated'


class _QuietFilter(std_logging.Filter):
    """Keeps every record of this package; of the libraries, warnings and errors not in NOISE,
    each on its own line: their tracebacks are dropped (a failed checkpoint write logged ~10
    from Orbax's threads before this package's one-line error said what happened)."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        if record.pathname.startswith(_PACKAGE_DIR):
            return True
        if record.levelno <= std_logging.INFO or _NOISE_RE.search(record.getMessage()):
            return False
        record.exc_info = record.exc_text = record.stack_info = None
        return True


_FILTER = _QuietFilter()


class PlainFormatter(std_logging.Formatter):
    """Lines for people at the default verbosity: the time and the message (``warning:`` /
    ``error:`` in front of those), without absl's level letter, thread id and source line."""

    def format(self, record: std_logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= std_logging.ERROR:
            message = f'error: {message}'
        elif record.levelno >= std_logging.WARNING:
            message = f'warning: {message}'
        return f'{self.formatTime(record, "%H:%M:%S")} {message}'


# Loggers whose records may reach a handler other than absl's (sacreBLEU's command line sets
# up its own); a logger's filter sees the records logged on it directly.
_NOISY_LOGGERS = ('sacrebleu', 'jax._src.xla_bridge', 'absl')


def _quiet_unraisable(unraisable: Any) -> None:
    # Tensorstore callbacks of a failed Orbax save or restore that fire after its event loop
    # closed: one traceback each, after the error that explains them was reported.
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == 'Event loop is closed'):
        sys.__unraisablehook__(unraisable)


def _filtered() -> list[Any]:
    """Where `_FILTER` goes: absl's handler and the libraries' own loggers."""
    return [logging.get_absl_handler(), *(std_logging.getLogger(n) for n in _NOISY_LOGGERS)]


def quiet_library_logs() -> None:
    """Installs the default-verbosity filters (see the module docstring)."""
    sys.unraisablehook = _quiet_unraisable
    for target in _filtered():
        target.addFilter(_FILTER)
    warnings.filterwarnings('ignore', message=_DEPRECATION, category=DeprecationWarning)
    # TensorFlow (read only for TFDS datasets) logs from C++ unless told before its import.
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """The libraries' loggers filtered as at the default verbosity for a block only (the Python
    API: nothing stays changed in the caller's process)."""
    # Only where it is not already (a command earlier in this process installed it for good):
    # removing it there would change the caller's logging.
    targets = [target for target in _filtered() if _FILTER not in target.filters]
    for target in targets:
        target.addFilter(_FILTER)
    try:
        yield
    finally:
        for target in targets:
            target.removeFilter(_FILTER)


def verbose_library_logs() -> None:
    """Removes those filters: every library line is shown again."""
    sys.unraisablehook = sys.__unraisablehook__
    for target in _filtered():
        target.removeFilter(_FILTER)


def argv_verbosity(argv: Sequence[str]) -> int:
    """The ``--verbosity`` / ``-v`` value in ``argv`` (0 when absent), read before absl parses
    the flags: config files are loaded during parsing, and their warnings must be filtered
    (or not) by then."""
    value = '0'
    args = list(argv)
    for i, arg in enumerate(args):
        for name in ('--verbosity', '-verbosity', '--v', '-v'):
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(name + '='):
                value = arg[len(name) + 1 :]
    try:
        return int(value)
    except ValueError:
        return 0
