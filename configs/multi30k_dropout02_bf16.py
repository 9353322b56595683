"""`python train.py --config configs/multi30k_dropout02_bf16.py`: the config ships inside the
package, in transformer/configs/multi30k_dropout02_bf16.py (also found by name:
`--config multi30k_dropout02_bf16`)."""

from transformer.configs.multi30k_dropout02_bf16 import get_config  # noqa: F401
