"""The normalizations around the sub-layers, one `variants.Variant` each (``model.norm``);
where they sit (post-LN, pre-LN) is ``model.pre_layer_norm``'s part, `variants.PARTS`.

Shape legend (transformer/model/attention.py): D d_model. Every parameter declares its logical
axis name ('embed' = D); transformer/training/parallel.py maps it onto a mesh axis.
"""

from __future__ import annotations

from flax import linen as nn

from transformer.model import variants
from transformer.model.config import TransformerConfig


def layer_norm(cfg: TransformerConfig, name: str) -> nn.LayerNorm:
    """LayerNorm (Ba et al., 2016): (x - mean) / sqrt(var + epsilon) * scale + bias over D."""
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_epsilon,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
        name=name,
    )


LAYER_NORM = variants.register(
    variants.Variant(
        'norm',
        'layer_norm',
        lambda cfg: {'scale': (cfg.d_model,), 'bias': (cfg.d_model,)},
        'Sec. 3.1: LayerNorm (Ba et al., 2016)',
        module=layer_norm,
    )
)


def rms_norm(cfg: TransformerConfig, name: str) -> nn.RMSNorm:
    """RMSNorm (Zhang and Sennrich, 2019): x / sqrt(mean(x^2) + epsilon) * scale over D; no
    mean subtracted, no bias."""
    return nn.RMSNorm(
        epsilon=cfg.layer_norm_epsilon,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
        name=name,
    )


RMS_NORM = variants.register(
    variants.Variant(
        'norm',
        'rms_norm',
        lambda cfg: {'scale': (cfg.d_model,)},
        'RMSNorm (Zhang and Sennrich, 2019): no centring, no bias',
        module=rms_norm,
    )
)
