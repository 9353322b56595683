"""Directories that a test module builds once per test session, shared by pytest-xdist's
workers: under ``-n`` a module's tests are split between workers, and each worker would
otherwise build the module's fixtures again (tests/test_export.py trains a run for ~30 s)."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import filelock


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """SESSION_TMP/``name``, made by ``build(path)`` by the first worker that asks, under a
    file lock that the others wait on; then every worker reads it (read it only: a test that
    changes it copies it first). SESSION_TMP is the directory all workers of this session
    share (pytest's own base directory without xdist). A build that raised is redone by the
    next worker that asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent  # pytest-of-USER/pytest-N, above the workers' popen-gwK
    path, done = root / name, root / f'{name}.built'
    with filelock.FileLock(str(root / f'{name}.lock')):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            done.touch()
    return path
