"""`python train.py --config configs/tiny.py`: the config ships inside the package, in
transformer/configs/tiny.py (also found by name: `transformer-train --config tiny`)."""

from transformer.configs.tiny import get_config  # noqa: F401
