"""What 'nothing changed' means for a directory: the hashes of every file under it."""

import hashlib
import os
from pathlib import Path


def tree_hashes(root) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``, links as their target's name and
    directories as 'dir': equal before and after a command that changed nothing there."""
    found = {}
    for path in sorted(Path(root).rglob('*')):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = f'link {os.readlink(path)}'
        elif path.is_dir():
            found[name] = 'dir'
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found
