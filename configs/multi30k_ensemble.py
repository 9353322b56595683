"""`python train.py --config configs/multi30k_ensemble.py`: an earlier name of
`configs/multi30k.py:ensemble` (transformer/configs/multi30k.py), the same settings."""

from transformer.configs.multi30k_ensemble import get_config  # noqa: F401
