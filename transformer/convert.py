"""`python -m transformer.convert` and `from transformer import convert`: the command lives in
transformer/commands/convert.py; this name is that module."""

import sys

from transformer.commands import convert

if __name__ == '__main__':
    convert.cli()
else:
    sys.modules[__name__] = convert
