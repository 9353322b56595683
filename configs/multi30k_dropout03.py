"""`python train.py --config configs/multi30k_dropout03.py`: the config ships inside the package,
in transformer/configs/multi30k_dropout03.py (also found by name: `--config multi30k_dropout03`)."""

from transformer.configs.multi30k_dropout03 import get_config  # noqa: F401
