"""`python -m transformer.export` and `from transformer import export`: the command lives in
transformer/commands/export.py; this name is that module."""

import sys

from transformer.commands import export

if __name__ == '__main__':
    export.cli()
else:
    sys.modules[__name__] = export
