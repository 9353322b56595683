"""The position-wise feed-forward networks, one `variants.Variant` each (``model.ffn``).

Shape legend (transformer/model/attention.py): B batch · T positions · D d_model · F d_ff.
Every parameter declares its logical axis names ('embed' = D, 'mlp' = F);
transformer/training/parallel.py maps them onto mesh axes.
"""

from __future__ import annotations

import jax
from flax import linen as nn

from transformer import backends
from transformer.model import variants
from transformer.model.config import TransformerConfig
from transformer.model.constraints import HIDDEN, constrain
from transformer.model.dropout import Dropout

Array = jax.Array


def dense(cfg: TransformerConfig, features: int, axes: tuple[str, str], name: str) -> nn.Dense:
    """A projection with a bias, Glorot-uniform kernel and the kernel's logical ``axes``."""
    return nn.Dense(
        features,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]),
        dot_general=backends.dense_dot_general,
        name=name,
    )


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Sec. 3.3); ``model.relu_dropout_rate`` drops out
    its hidden layer."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg = self.config
        h = nn.relu(dense(cfg, cfg.d_ff, ('embed', 'mlp'), 'wi')(x))  # [B, T, F]
        h = constrain(h, HIDDEN)
        h = Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
        return dense(cfg, x.shape[-1], ('mlp', 'embed'), 'wo')(h)


RELU = variants.register(
    variants.Variant(
        'ffn',
        'relu',
        lambda cfg: {
            'wi/kernel': (cfg.d_model, cfg.d_ff),
            'wi/bias': (cfg.d_ff,),
            'wo/kernel': (cfg.d_ff, cfg.d_model),
            'wo/bias': (cfg.d_model,),
        },
        'Sec. 3.3',
        module=FeedForward,
    )
)
