"""The paper's network in pure Flax: attention (einsum over an explicit head axis), the
encoder and decoder layers, the Transformer and its config, dropout, analytic FLOPs.

Everything a caller needs is importable from here: ``from transformer.model import
Transformer, TransformerConfig``.
"""

from transformer.model.config import TransformerConfig, config_from_dict
from transformer.model.layers import attention_mask, shift_right, sinusoidal_positions
from transformer.model.packing import Packing
from transformer.model.transformer import Transformer, init_cache
from transformer.tokens import EOS_ID, PAD_ID

__all__ = [
    'EOS_ID',
    'PAD_ID',
    'Packing',
    'Transformer',
    'TransformerConfig',
    'attention_mask',
    'config_from_dict',
    'init_cache',
    'shift_right',
    'sinusoidal_positions',
]
