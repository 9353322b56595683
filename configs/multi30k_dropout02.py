"""`python train.py --config configs/multi30k_dropout02.py`: an earlier name of
`configs/multi30k.py:dropout02` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_dropout02 import get_config  # noqa: F401
