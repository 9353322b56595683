"""`python train.py --config configs/multi30k_dropout02.py`: the config ships inside the package,
in transformer/configs/multi30k_dropout02.py (also found by name: `--config multi30k_dropout02`)."""

from transformer.configs.multi30k_dropout02 import get_config  # noqa: F401
