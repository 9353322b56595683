"""`python -m transformer.trainer` and `from transformer import trainer`: the command lives in
transformer/commands/train.py; this name is that module."""

import sys

from transformer.commands import train

if __name__ == '__main__':
    train.cli()
else:
    sys.modules[__name__] = train
