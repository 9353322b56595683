"""The paper's network in pure Flax: attention (einsum over an explicit head axis), the
encoder and decoder layers, the Transformer and its config, dropout, analytic FLOPs.

Everything a caller needs is importable from here: ``from transformer.model import
Transformer, TransformerConfig``.
"""

from transformer.model.config import TransformerConfig, config_from_dict
from transformer.model.transformer import (
    EOS_ID,
    PAD_ID,
    Transformer,
    attention_mask,
    init_cache,
    shift_right,
    sinusoidal_positions,
)

__all__ = [
    'EOS_ID',
    'PAD_ID',
    'Transformer',
    'TransformerConfig',
    'attention_mask',
    'config_from_dict',
    'init_cache',
    'shift_right',
    'sinusoidal_positions',
]
