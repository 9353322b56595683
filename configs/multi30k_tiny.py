"""`python train.py --config configs/multi30k_tiny.py`: an earlier name of
`configs/multi30k.py:tiny_cpu` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_tiny import get_config  # noqa: F401
