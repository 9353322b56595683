"""The experiment configs, shipped inside the package so that an installed command finds them
from any directory: ``transformer-train --config base`` (a name) or ``--config
path/to/file.py`` (a path, as ``python train.py --config configs/base.py``). An earlier
config file's name (`RENAMED`) stops in one line that names the variant holding its settings
(`moved`)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import ml_collections

__all__ = ['checked', 'load', 'moved', 'names', 'path']

_DIR = os.path.dirname(os.path.abspath(__file__))
# Earlier config files -> the variant of multi30k.py with the same settings.
RENAMED = {
    'multi30k_bf16': 'bf16',
    'multi30k_cooldown': 'cooldown',
    'multi30k_dropout02': 'dropout02',
    'multi30k_dropout02_bf16': 'dropout02_bf16',
    'multi30k_dropout03': 'dropout03',
    'multi30k_ensemble': 'ensemble',
    'multi30k_lowercase': 'lowercase',
    'multi30k_tiny': 'tiny_cpu',
}


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
      ValueError: no such config (an earlier name: the line of ``moved``), or a file that does
        not load, has no ``get_config``, raises in it or returns something else than a
        ConfigDict; one line that names the file.
    """
    if line := moved(name_or_path):
        raise ValueError(line)
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


def moved(name_or_path: str) -> str | None:
    """The line that names the variant an earlier config file became, as ``--config`` gave it
    ("configs/multi30k_tiny.py is now configs/multi30k.py:tiny_cpu (the same settings)."), or
    None: not an earlier name, or a file of that name exists."""
    given = name_or_path.partition(':')[0]
    folder, base = os.path.split(given)
    stem = base.removesuffix('.py')
    if stem not in RENAMED or os.path.isfile(given):
        return None
    new = os.path.join(folder, 'multi30k.py' if base.endswith('.py') else 'multi30k')
    return f'{given} is now {new}:{RENAMED[stem]} (the same settings).'


def checked(config: Any, file: str) -> ml_collections.ConfigDict:
    """``config`` if it is what a config file's ``get_config()`` must return (a ConfigDict
    with a section per key); else a one-line ValueError naming ``file``."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(
            f'{file}: get_config() returned {type(config).__name__} {config!r:.60}, not an '
            'ml_collections.ConfigDict.'
        )
    return config
