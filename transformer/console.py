"""Console output of the command-line tools: our progress lines, not the libraries' chatter."""

from __future__ import annotations

import functools
import logging as std_logging
import os
import sys
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


USAGE_EXIT_CODE = 2  # a command line that cannot run (the argparse convention)


def usage_exit(message: str) -> None:
    """Ends the command with ``error: message`` (one line) and exit code 2."""
    print(f'error: {" ".join(message.split())}', file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT_CODE)


def _parse_flags(
    argv: list[str], explain: Callable[[Exception, list[str]], str | None] | None
) -> list[str]:
    # Errors of the command line itself, including ml_collections' override parsing (which
    # raises AttributeError / KeyError / TypeError from inside absl): one line, no traceback.
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        message = explain(e, argv) if explain is not None else None
        usage_exit(message or (str(e).strip().splitlines() or [type(e).__name__])[0])


def run(
    main: Callable[[list[str]], None],
    argv: Sequence[str] | None = None,
    explain_flag_error: Callable[[Exception, list[str]], str | None] | None = None,
) -> None:
    """``absl.app.run`` with our console settings; ``argv`` for in-process use (tests).

    A command line that does not parse ends with one ``error:`` line and exit code 2;
    ``explain_flag_error(error, argv)`` may word that line (None: the error's first line).
    """

    def wrapped(args):
        quiet_library_logs()
        if len(args) > 1:
            raise app.UsageError(f'Unexpected arguments: {args[1:]}')
        main(args)

    app.run(
        wrapped,
        argv=list(argv) if argv is not None else None,
        flags_parser=functools.partial(_parse_flags, explain=explain_flag_error),
    )
