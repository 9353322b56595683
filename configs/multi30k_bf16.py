"""`python train.py --config configs/multi30k_bf16.py`: an earlier name of
`configs/multi30k.py:bf16` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_bf16 import get_config  # noqa: F401
