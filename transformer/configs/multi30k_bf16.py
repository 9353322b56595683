"""An earlier name of `configs/multi30k.py:bf16` (the same settings), kept so that commands
that name it still run."""

from transformer.configs import multi30k


def get_config():
    return multi30k.renamed('multi30k_bf16', 'bf16')
