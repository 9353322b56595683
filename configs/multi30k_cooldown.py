"""`python train.py --config configs/multi30k_cooldown.py`: the config ships inside the package,
in transformer/configs/multi30k_cooldown.py (also found by name: `--config multi30k_cooldown`)."""

from transformer.configs.multi30k_cooldown import get_config  # noqa: F401
