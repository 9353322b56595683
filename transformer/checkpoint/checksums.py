"""Content checksums of the files of a directory: the manifest that seals a checkpoint step.

The manifest is a JSON file inside the directory it describes:
``{"format": 1, "files": {"params/d/ab12...": {"size": 81506, "sha256": "..."}, ...}}``, paths
relative to the directory with ``/`` separators. It is written under a temporary name and
renamed, so a reader sees the whole manifest or none. When and for which directories it is
written and checked is transformer/checkpoint/directory.py's business.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Collection

FORMAT = 1


class Mismatch(Exception):
    """A file that differs from the manifest (``file``: its relative path, or the manifest)."""

    def __init__(self, file: str, reason: str):
        super().__init__(f'{file} {reason}')
        self.file, self.reason = file, reason


def sha256(file_path: str) -> str:
    with open(file_path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


def _files(directory: str, manifest: str) -> list[str]:
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, '/')
            if rel != manifest:
                found.append(rel)
    return sorted(found)


def write(directory: str, manifest: str) -> None:
    """Writes ``directory/manifest`` with the size and sha256 of every other file there."""
    files = {}
    for rel in _files(directory, manifest):
        full = os.path.join(directory, rel)
        files[rel] = {'size': os.path.getsize(full), 'sha256': sha256(full)}
    content = json.dumps({'format': FORMAT, 'files': files}, indent=1, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{manifest}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, manifest))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def verify(directory: str, manifest: str, items: Collection[str] | None = None) -> bool:
    """Checks the files the manifest lists against their sizes and hashes.

    Args:
      directory: the directory the manifest describes.
      manifest: the manifest's file name inside it.
      items: check only top-level files and these top-level subdirectories (None: all).

    Returns:
      True when every checked file matches; False when there is no manifest.

    Raises:
      Mismatch: a listed file is missing, has another size or another sha256, or the
        manifest itself cannot be read.
    """
    manifest_path = os.path.join(directory, manifest)
    if not os.path.exists(manifest_path):
        return False
    try:
        with open(manifest_path) as f:
            files = json.load(f)['files']
        listed = sorted(files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise Mismatch(manifest, f'cannot be read ({type(e).__name__})') from None
    for rel, want in listed:
        top = rel.split('/')[0]
        if items is not None and '/' in rel and top not in items:
            continue
        full = os.path.join(directory, rel)
        if not os.path.isfile(full):
            raise Mismatch(rel, 'is missing')
        size = os.path.getsize(full)
        if size != want['size']:
            raise Mismatch(rel, f'has {size} bytes where the manifest says {want["size"]}')
        if sha256(full) != want['sha256']:
            raise Mismatch(rel, 'has another sha256 than the manifest (changed on disk)')
    return True
