"""`python train.py --config configs/multi30k_lowercase.py`: an earlier name of
`configs/multi30k.py:lowercase` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_lowercase import get_config  # noqa: F401
