"""`python train.py --config configs/multi30k.py`: the config ships inside the package, in
transformer/configs/multi30k.py (also found by name: `transformer-train --config multi30k`)."""

from transformer.configs.multi30k import get_config  # noqa: F401
