"""`python train.py --config configs/base.py`: the config ships inside the package, in
transformer/configs/base.py (also found by name: `transformer-train --config base`)."""

from transformer.configs.base import get_config  # noqa: F401
