"""`python train.py --config configs/multi30k_dropout03.py`: an earlier name of
`configs/multi30k.py:dropout03` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_dropout03 import get_config  # noqa: F401
