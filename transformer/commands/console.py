"""What every command shares: its run (`run`: console settings, errors, exit codes, the
process-wide settings it opts in to), usage errors in one line, the checks of its path flags.

The libraries' log lines are library_logs.py's, the shared flags shared_flags.py's; the
names of those the commands call are part of this public API too (``console.define_flag``).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence

from absl import app, flags, logging

from transformer import decoding, files
from transformer.backends import compile_cache, host_memory
from transformer.commands import help as command_help
from transformer.commands import library_logs, ownership
from transformer.commands.library_logs import (
    argv_verbosity,
    quiet_libraries,
    quiet_library_logs,
    verbose_library_logs,
)
from transformer.commands.shared_flags import (
    _COMMAND_FLAGS,
    define_checkpoint_flags,
    define_decoding_flags,
    define_flag,
    define_language_flags,
    define_penalty_flags,
    resolve_config_arg,
)

__all__ = [
    'DECODING_OUT_OF_MEMORY',
    'search_settings',
    'USAGE_EXIT_CODE',
    'argv_verbosity',
    'check_paths',
    'define_checkpoint_flags',
    'define_decoding_flags',
    'define_penalty_flags',
    'define_language_flags',
    'define_flag',
    'out_of_memory_line',
    'quiet_libraries',
    'quiet_library_logs',
    'require',
    'resolve_config_arg',
    'run',
    'usage_exit',
    'verbose_library_logs',
]


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
    work (a decode of minutes was lost when the output could not be opened at its end), or
    that names a file of a run, a model or an export (`ownership.output_refusal`).

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
        refusal = ownership.output_refusal(file)
        if refusal:
            usage_exit(f'--{name}={file}: {refusal}')


def _forget_config_overrides() -> None:
    """Removes the --config.KEY flags an earlier command of this process left: ml_collections
    defines one for each override it parses, and one left would be "defined twice" once that
    command had stopped at a bad value. The overrides a command is given are defined again
    as it parses."""
    for name in [n for n in flags.FLAGS if '.' in n and n.split('.', 1)[0] in flags.FLAGS]:
        delattr(flags.FLAGS, name)


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


SAMPLING_FLAGS = ('temperature', 'top_k', 'top_p', 'seed', 'num_samples')


def search_settings() -> tuple[decoding.Sampling | None, decoding.Constraints | None]:
    """The sampling settings (None without --sampling) and the constraints (None when off)
    of the decoding flags; one usage line for a value or a combination that cannot work."""
    values = {name: flags.FLAGS[name].value for name in SAMPLING_FLAGS}
    constraints = decoding.Constraints(flags.FLAGS.min_length, flags.FLAGS.no_repeat_ngram)
    sampling = None
    try:
        constraints.check()
        if flags.FLAGS.sampling:
            given = {name: value for name, value in values.items() if value is not None}
            if given.get('top_k', 1) < 1:  # unset means every token; a given K keeps K
                raise ValueError(f'top_k must be >= 1, got {given["top_k"]}.')
            sampling = decoding.Sampling(**given)
            sampling.check()
    except ValueError as e:
        usage_exit(f'--{e}')
    if not flags.FLAGS.sampling:
        given = [name for name, value in values.items() if value is not None]
        if given:
            usage_exit(f'--{given[0]} is a sampling setting: add --sampling.')
    elif flags.FLAGS.beam_size not in (None, 1):
        usage_exit(f'--sampling draws outputs; it takes no --beam_size={flags.FLAGS.beam_size}.')
    return sampling, constraints if constraints.active else None


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
            logging.get_absl_handler().setFormatter(library_logs.PlainFormatter())
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
    _forget_config_overrides()
    app.run(
        wrapped,
        argv=args,
        flags_parser=functools.partial(_parse_flags, explain=explain_flag_error),
    )
