"""`python train.py --config configs/multi30k_recipe.py`: the config ships inside the package,
in transformer/configs/multi30k_recipe.py (also found by name: `--config multi30k_recipe`)."""

from transformer.configs.multi30k_recipe import get_config  # noqa: F401
