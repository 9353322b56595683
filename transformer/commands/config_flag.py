"""The ``--config`` flag's errors in one line: an override of a key the config does not have
("unknown config key model.d_modle; did you mean model.d_model?"), a config file that raises,
a section named without ``--config.``."""

from __future__ import annotations

import os
from collections.abc import Sequence

import ml_collections

from transformer.fields import ConfigError, check_keys

__all__ = ['explain_flag_error', 'unknown_key_message']


def _keys(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
    keys = []
    for name, value in config.items():
        keys.append(prefix + name)
        if isinstance(value, ml_collections.ConfigDict):
            keys += _keys(value, f'{prefix}{name}.')
    return keys


def unknown_key_message(config: ml_collections.ConfigDict, argv: Sequence[str]) -> str | None:
    """ "unknown config key K; did you mean M?" for the first ``--config.K`` override in
    ``argv`` that ``config`` does not have (None: every override names a key)."""
    overrides = [
        arg[len('--config.') :].split('=', 1)[0] for arg in argv if arg.startswith('--config.')
    ]
    try:
        check_keys('', overrides, _keys(config))
    except ConfigError as e:
        return str(e)
    return None


def explain_flag_error(error: Exception, argv: list[str]) -> str | None:
    """Names an unknown ``--config.KEY`` override and the nearest valid key."""
    from absl import flags

    if isinstance(error, flags.UnrecognizedFlagError):
        name = error.flagname
        if name.split('.')[0] in ('model', 'data', 'opt', 'train', 'eval'):
            return f"Unknown command line flag '{name}'; did you mean --config.{name}?"
    lines = str(error).strip().splitlines() or [type(error).__name__]
    # ml_collections wraps a TypeError or ValueError of get_config() around its traceback,
    # whose last line is the error itself.
    wrapped = 'Error whilst parsing config file:'
    if wrapped in lines[0]:
        return lines[0].replace(wrapped, lines[-1].strip())
    if isinstance(error, flags.Error):
        return None  # absl's own message names the flag and the bad value
    config_arg = next(
        (a for a in argv if a.startswith('--config=') and '.' not in a.split('=')[0]), None
    )
    if config_arg is None and '--config' in argv[:-1]:
        config_arg = '--config=' + argv[argv.index('--config') + 1]
    if config_arg is None:
        return None
    file = config_arg.split('=', 1)[1]
    try:
        config = flags.FLAGS['config'].parser.parse(file)
    except Exception:  # noqa: BLE001 - the config file's own error, in one line naming it
        line, file = lines[0], file.split(':')[0]
        return line if os.path.basename(file) in line else f'{file}: {line}'
    return unknown_key_message(config, argv)
