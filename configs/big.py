"""`python train.py --config configs/big.py`: the config ships inside the package, in
transformer/configs/big.py (also found by name: `transformer-train --config big`)."""

from transformer.configs.big import get_config  # noqa: F401
