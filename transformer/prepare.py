"""`python -m transformer.prepare` and `from transformer import prepare`: the command lives in
transformer/commands/prepare.py; this name is that module."""

import sys

from transformer.commands import prepare

if __name__ == '__main__':
    prepare.cli()
else:
    sys.modules[__name__] = prepare
