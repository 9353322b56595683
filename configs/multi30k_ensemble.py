"""`python train.py --config configs/multi30k_ensemble.py`: the config ships inside the package,
in transformer/configs/multi30k_ensemble.py (also found by name: `--config multi30k_ensemble`)."""

from transformer.configs.multi30k_ensemble import get_config  # noqa: F401
