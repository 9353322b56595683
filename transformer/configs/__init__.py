"""The experiment configs, shipped inside the package so that an installed command finds them
from any directory: ``transformer-train --config base`` (a name) or ``--config
path/to/file.py`` (a path, as ``python train.py --config configs/base.py``)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import ml_collections

__all__ = ['checked', 'load', 'names', 'path']

_DIR = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The packaged configs: the names of the .py files in this directory."""
    return sorted(f[:-3] for f in os.listdir(_DIR) if f.endswith('.py') and f[0] != '_')


def path(name: str) -> str:
    """The file of the packaged config ``name``."""
    return os.path.join(_DIR, f'{name}.py')


def load(name_or_path: str) -> Any:
    """``get_config()`` of a config file, or of the packaged config of that name; with
    ``:VARIANT`` after either (``multi30k:tiny``, ``configs/multi30k.py:tiny``),
    ``get_config('VARIANT')``, as ``--config`` passes it.

    Raises:
      ValueError: no such config, or a file that does not load, has no ``get_config``, raises
        in it or returns something else than a ConfigDict; one line that names the file.
    """
    name_or_path, colon, variant = name_or_path.partition(':')
    file = name_or_path if os.path.isfile(name_or_path) else path(name_or_path)
    if not os.path.isfile(file):
        raise ValueError(
            f'No config {name_or_path!r}: the packaged configs are {names()}, or give a file path.'
        )
    try:
        spec = importlib.util.spec_from_file_location('loaded_config', file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(variant) if colon else module.get_config()
    except Exception as e:  # noqa: BLE001 - whatever the file raised, the line names it
        first = (str(e).strip().splitlines() or [''])[0]
        raise ValueError(f'{file}: {type(e).__name__}: {first}'.rstrip(': ')) from None
    return checked(config, file)


def checked(config: Any, file: str) -> ml_collections.ConfigDict:
    """``config`` if it is what a config file's ``get_config()`` must return (a ConfigDict
    with a section per key); else a one-line ValueError naming ``file``."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(
            f'{file}: get_config() returned {type(config).__name__} {config!r:.60}, not an '
            'ml_collections.ConfigDict.'
        )
    return config
