"""The environment of a process a test starts: this one's, with the repository first on
PYTHONPATH (and what was there kept: packages may be installed through it)."""

import os
import pathlib

REPO = str(pathlib.Path(__file__).resolve().parents[1])


def repo_env(**overrides: str) -> dict[str, str]:
    """os.environ with REPO prepended to PYTHONPATH, then ``overrides``."""
    path = [REPO, *filter(None, os.environ.get('PYTHONPATH', '').split(os.pathsep))]
    return {**os.environ, 'PYTHONPATH': os.pathsep.join(path), **overrides}
