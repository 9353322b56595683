"""The commands' entry points called in-process, as their command line would."""

import pytest

from transformer import convert


def convert_cli(*args):
    """``transformer.convert`` with ``args``: its exit code or one-line message (None: it
    succeeded)."""
    with pytest.raises(SystemExit) as info:
        convert.cli(['convert', *args])
    return info.value.code
