"""`python -m transformer.score` and `from transformer import score`: the command lives in
transformer/commands/score.py; this name is that module."""

import sys

from transformer.commands import score

if __name__ == '__main__':
    score.cli()
else:
    sys.modules[__name__] = score
