"""The experiment configs, shipped inside the package so that an installed command finds them
from any directory: ``transformer-train --config base`` (a name) or ``--config
path/to/file.py`` (a path, as ``python train.py --config configs/base.py``)."""

from __future__ import annotations

import os

_DIR = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The packaged configs: the names of the .py files in this directory."""
    return sorted(f[:-3] for f in os.listdir(_DIR) if f.endswith('.py') and f[0] != '_')


def path(name: str) -> str:
    """The file of the packaged config ``name``."""
    return os.path.join(_DIR, f'{name}.py')
