"""Console output of the command-line tools: our progress lines, not the libraries' chatter."""

from __future__ import annotations

import logging as std_logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags, logging

# Libraries that log every checkpoint file and array at INFO through absl.
_QUIET_PATHS = (f'{os.sep}orbax{os.sep}', f'{os.sep}etils{os.sep}')


class _LibraryInfoFilter(std_logging.Filter):
    """Drops INFO (and below) records that come from the listed libraries' files."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        if record.levelno > std_logging.INFO:
            return True
        return not any(part in record.pathname for part in _QUIET_PATHS)


def quiet_library_logs() -> None:
    """Keeps warnings from every library but INFO lines only from this package and absl."""
    logging.get_absl_handler().addFilter(_LibraryInfoFilter())


def define_flag(name: str, define: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Defines the absl flag ``name`` unless this process already has it.

    The commands (train, evaluate, translate, visualize) share flag names such as
    ``--workdir``; defining each once lets several of them run in one process (tests).
    """
    if name not in flags.FLAGS:
        define(name, *args, **kwargs)


def define_decoding_flags() -> None:
    """Flags shared by the evaluate and translate commands: which checkpoint, which search."""
    define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')
    define_flag(
        'step', flags.DEFINE_integer, None, 'Checkpoint step to load (default: the latest).'
    )
    define_flag(
        'average_last',
        flags.DEFINE_integer,
        None,
        'Average the last K checkpoints (default: eval.average_last).',
    )
    define_flag('beam_size', flags.DEFINE_integer, None, 'Beam size; 1 = greedy (default: config).')
    define_flag('alpha', flags.DEFINE_float, None, 'Length penalty alpha (default: eval.alpha).')
    define_flag('batch_size', flags.DEFINE_integer, None, 'Sentences per batch (default: config).')


def require(*names: str) -> None:
    """A usage error naming the first missing required flag."""
    for name in names:
        if flags.FLAGS[name].value is None:
            raise app.UsageError(f'--{name} is required.')


def run(main: Callable[[list[str]], None], argv: Sequence[str] | None = None) -> None:
    """``absl.app.run`` with our console settings; ``argv`` for in-process use (tests)."""

    def wrapped(args):
        quiet_library_logs()
        if len(args) > 1:
            raise app.UsageError(f'Unexpected arguments: {args[1:]}')
        main(args)

    app.run(wrapped, argv=list(argv) if argv is not None else None)
