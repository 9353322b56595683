"""`python train.py --config configs/multi30k_tiny.py`: the config ships inside the package,
in transformer/configs/multi30k_tiny.py (also found by name: `--config multi30k_tiny`)."""

from transformer.configs.multi30k_tiny import get_config  # noqa: F401
