"""Console output of the command-line tools: our progress lines, not the libraries' chatter.

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
import difflib
import functools
import logging as std_logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from absl import app, flags, logging

from transformer import files
from transformer.backends import compile_cache, host_memory
from transformer.commands import help as command_help

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


class _PlainFormatter(std_logging.Formatter):
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
    targets = _filtered()
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


def define_flag(name: str, define: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Defines the absl flag ``name`` (default ``args[0]``) unless this process has it, else
    gives it this command's default: the commands share flag names (``--workdir``, ``--out``
    of export and visualize) and several may run in one process (tests, the Python API)."""
    if name not in flags.FLAGS:
        define(name, *args, **kwargs)
    elif flags.FLAGS[name].default != args[0]:
        flags.FLAGS.set_default(name, args[0])
    _COMMAND_FLAGS.append(name)


# The flags the command about to run defined (`define_flag`), for its --help; `run` clears it.
_COMMAND_FLAGS: list[str] = []


def resolve_config_arg(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--config NAME`` (``--config=NAME``, ``NAME:args``) made the path of the
    packaged config NAME (transformer/configs/NAME.py) when NAME is not an existing file.

    ml_collections' config flag only takes paths, and loads the file while absl parses the
    flags, so names are resolved before that. Paths are left as they are.
    """
    from transformer import configs

    def resolve(value: str) -> str:
        name, colon, rest = value.partition(':')
        if os.path.exists(name):
            return value
        if name.endswith('.py') or os.sep in name:
            folder = os.path.dirname(name) or '.'
            near = (
                sorted(f for f in os.listdir(folder) if f.endswith('.py'))
                if (os.path.isdir(folder))
                else []
            )
            close = difflib.get_close_matches(os.path.basename(name), near, n=1)
            hint = (
                f'; did you mean {os.path.join(os.path.dirname(name), close[0])}?' if close else '.'
            )
            raise app.UsageError(f'--config {name}: no such file{hint}')
        if name not in configs.names():
            close = difflib.get_close_matches(name, configs.names(), n=1)
            hint = f' Did you mean {close[0]}?' if close else ''
            raise app.UsageError(
                f'--config {name}: no such file, and the packaged configs are '
                f'{", ".join(configs.names())}.{hint}'
            )
        return configs.path(name) + colon + rest

    args = list(argv)
    for i, arg in enumerate(args):
        if arg in ('--config', '-config') and i + 1 < len(args):
            args[i + 1] = resolve(args[i + 1])
        elif arg.startswith(('--config=', '-config=')):
            flag, _, value = arg.partition('=')
            args[i] = f'{flag}={resolve(value)}'
    return args


def define_decoding_flags() -> None:
    """Flags shared by the evaluate and translate commands: which checkpoint, which search."""
    define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')
    define_flag(
        'step',
        flags.DEFINE_integer,
        None,
        'Checkpoint step to load (default: the latest); with --average_last, the last one '
        'of those averaged.',
    )
    define_flag(
        'average_last',
        flags.DEFINE_integer,
        None,
        'Average the last K checkpoints, up to --step if given (default without --step: '
        'eval.average_last).',
        lower_bound=1,
    )
    define_flag(
        'best',
        flags.DEFINE_bool,
        False,
        'Load the best checkpoint by validation BLEU (WORKDIR/best) instead.',
    )
    define_flag(
        'beam_size',
        flags.DEFINE_integer,
        None,
        'Beam size; 1 = greedy (default: config).',
        lower_bound=1,
    )
    define_flag(
        'alpha',
        flags.DEFINE_float,
        None,
        'Length penalty alpha (default: eval.alpha).',
        lower_bound=0.0,
    )
    if 'not finite' not in [v.message for v in flags.FLAGS['alpha'].validators]:  # inf, nan
        flags.register_validator('alpha', lambda v: v is None or math.isfinite(v), 'not finite')
    define_flag(
        'batch_size',
        flags.DEFINE_integer,
        None,
        'Sentences per batch (default: config).',
        lower_bound=1,
    )
    define_flag(
        'ensemble',
        flags.DEFINE_list,
        [],
        'Other workdirs decoded together with --workdir as one ensemble (comma-separated; '
        'the same model and vocabulary; each loaded by --step / --average_last / --best).',
    )


def require(*names: str, empty_ok: bool = False) -> None:
    """A usage error naming the first missing (or, unless ``empty_ok``, empty) required flag."""
    for name, value in ((name, flags.FLAGS[name].value) for name in names):
        if value is None or (value == '' and not empty_ok):
            usage_exit(f'--{name} is {"required" if value is None else "empty"}.')


USAGE_EXIT_CODE = 2  # a command line that cannot run (the argparse convention)


def usage_exit(message: str) -> None:
    """Ends the command with ``error: message`` (one line) and exit code 2."""
    print(f'error: {" ".join(message.split())}', file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT_CODE)


def check_paths(
    inputs: Mapping[str, str | None] | None = None, outputs: Mapping[str, str | None] | None = None
) -> None:
    """Ends the command with one usage line (`usage_exit`) for an input flag's file that cannot
    be read, or an output flag's path whose directory is missing or read-only, before any
    work (a decode of minutes was lost when the output could not be opened at its end).

    Args:
      inputs: flag name -> the file it names (None: the flag is unset).
      outputs: flag name -> the file it will write (None: unset).
    """
    for name, file in (inputs or {}).items():
        if file and not (os.path.isfile(file) and os.access(file, os.R_OK)):
            usage_exit(f'--{name}={file}: no readable file there.')
    for name, file in (outputs or {}).items():
        if not file:
            continue
        directory = os.path.dirname(os.path.abspath(file))
        if os.path.isdir(file):
            usage_exit(f'--{name}={file} is a directory; give a file path.')
        if not os.path.isdir(directory):
            usage_exit(f'--{name}={file}: the directory {directory} does not exist.')
        problem = files.unwritable(directory)
        if problem:
            usage_exit(f'--{name}={file}: the directory {directory} is not writable ({problem}).')


def _parse_flags(
    argv: list[str], explain: Callable[[Exception, list[str]], str | None] | None
) -> list[str]:
    # Errors of the command line itself, including ml_collections' override parsing (which
    # raises AttributeError / KeyError / TypeError from inside absl) and loading the config
    # file (its own SyntaxError, NameError, ...): one line, no traceback.
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - whatever parsing raised, the line says it
        message = explain(e, argv) if explain is not None else None
        usage_exit(message or (str(e).strip().splitlines() or [type(e).__name__])[0])


# The end of the one line that decoding commands stop with when they run out of memory.
DECODING_OUT_OF_MEMORY = 'Lower --batch_size (sentences decoded at once) or --beam_size.'


def out_of_memory_line(error: BaseException, hint: str) -> str | None:
    """One line for XLA's out-of-memory error (``RESOURCE_EXHAUSTED``), ending with ``hint``
    (what to lower); None for any other error."""
    text = str(error)
    if isinstance(error, MemoryError):  # numpy's: "Unable to allocate 58.2 TiB for an array ..."
        return f'out of memory: {text.rstrip(".")}. {hint}'.strip()
    found = re.search(r'Out of memory([^\n]*)', text, re.IGNORECASE)
    if found is None and not ('RESOURCE_EXHAUSTED' in text and 'memory' in text.lower()):
        return None
    detail = found.group(1).rstrip('. ') if found else ''
    size = re.search(r'(\d{7,}) bytes', detail)
    if size:
        detail += f' ({int(size.group(1)) / 2**30:.1f} GiB)'
    return f'out of memory{detail}. {hint}'.strip()


def run(
    main: Callable[[list[str]], None],
    argv: Sequence[str] | None = None,
    explain_flag_error: Callable[[Exception, list[str]], str | None] | None = None,
    out_of_memory_hint: str = '',
) -> None:
    """``absl.app.run`` with our console settings; ``argv`` for in-process use (tests).

    The command runs with jax's persistent compilation cache on (`compile_cache`) and, where
    jax computes on the CPU, the malloc settings of `host_memory`. A command
    line that does not parse ends with one ``error:`` line and exit code 2;
    ``explain_flag_error(error, argv)`` may word that line (None: the error's first line).
    Running out of device or host memory ends with one ``error:`` line (exit code 1) that
    ends with ``out_of_memory_hint``.
    """
    args = list(argv) if argv is not None else list(sys.argv)
    own_flags, _COMMAND_FLAGS[:] = list(_COMMAND_FLAGS), []
    if command_help.wanted(args):
        doc = sys.modules[main.__module__].__doc__
        try:
            print(command_help.text(doc, own_flags, args))
        except Exception as e:  # noqa: BLE001 - a config file that does not load
            usage_exit(f'--help could not read the config: {(str(e).splitlines() or [e])[0]}')
        raise SystemExit(0)
    verbose = argv_verbosity(args[1:]) >= 1
    if not verbose:
        quiet_library_logs()

    def wrapped(args):
        if verbose or flags.FLAGS.verbosity >= 1:
            verbose_library_logs()
        else:
            quiet_library_logs()
            logging.get_absl_handler().setFormatter(_PlainFormatter())
        if len(args) > 1:
            usage_exit(f'Unexpected arguments: {args[1:]} (every option is a --flag).')
        compile_cache.configure()
        host_memory.configure()  # before jax's first computation: see host_memory
        try:
            main(args)
        except KeyboardInterrupt:
            print('Interrupted.', file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        except (RuntimeError, MemoryError) as e:  # jax.errors.JaxRuntimeError, numpy's
            line = out_of_memory_line(e, out_of_memory_hint)
            if line is None:
                raise
            raise SystemExit(f'error: {line}') from None
        except OSError as e:  # a full disk, a read-only directory, a file that went away
            raise SystemExit(f'error: {files.os_error_line(e)}') from None

    # Every command starts from the flags' defaults, not the values an earlier command of the
    # same process (tests) parsed.
    flags.FLAGS.unparse_flags()
    app.run(
        wrapped,
        argv=args,
        flags_parser=functools.partial(_parse_flags, explain=explain_flag_error),
    )
