"""`python -m transformer.translate` and `from transformer import translate`: the command lives in
transformer/commands/translate.py; this name is that module."""

import sys

from transformer.commands import translate

if __name__ == '__main__':
    translate.cli()
else:
    sys.modules[__name__] = translate
