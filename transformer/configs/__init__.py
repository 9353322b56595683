"""The experiment configs, shipped inside the package so that an installed command finds them
from any directory: ``transformer-train --config base`` (a name) or ``--config
path/to/file.py`` (a path, as ``python train.py --config configs/base.py``)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

_DIR = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The packaged configs: the names of the .py files in this directory."""
    return sorted(f[:-3] for f in os.listdir(_DIR) if f.endswith('.py') and f[0] != '_')


def path(name: str) -> str:
    """The file of the packaged config ``name``."""
    return os.path.join(_DIR, f'{name}.py')


def load(name_or_path: str) -> Any:
    """``get_config()`` of a config file, or of the packaged config of that name."""
    file = name_or_path if os.path.isfile(name_or_path) else path(name_or_path)
    if not os.path.isfile(file):
        raise ValueError(
            f'No config {name_or_path!r}: the packaged configs are {names()}, or give a file path.'
        )
    spec = importlib.util.spec_from_file_location('loaded_config', file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()
