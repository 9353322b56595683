"""`python -m transformer.evaluate` and `from transformer import evaluate`: the command lives in
transformer/commands/evaluate.py; this name is that module."""

import sys

from transformer.commands import evaluate

if __name__ == '__main__':
    evaluate.cli()
else:
    sys.modules[__name__] = evaluate
