"""`python train.py --config configs/multi30k_lowercase.py`: the config ships inside the package,
in transformer/configs/multi30k_lowercase.py (also found by name: `--config multi30k_lowercase`)."""

from transformer.configs.multi30k_lowercase import get_config  # noqa: F401
