"""`python -m transformer.visualize` and `from transformer import visualize`: the command lives in
transformer/commands/visualize.py; this name is that module."""

import sys

from transformer.commands import visualize

if __name__ == '__main__':
    visualize.cli()
else:
    sys.modules[__name__] = visualize
