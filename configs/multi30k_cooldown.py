"""`python train.py --config configs/multi30k_cooldown.py`: an earlier name of
`configs/multi30k.py:cooldown` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_cooldown import get_config  # noqa: F401
