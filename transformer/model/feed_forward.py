"""The position-wise feed-forward networks, one `variants.Variant` each (``model.ffn``).

Shape legend (transformer/model/attention.py): B batch · T positions · D d_model · F d_ff.
Every parameter declares its logical axis names ('embed' = D, 'mlp' = F);
transformer/training/parallel.py maps them onto mesh axes.
"""

from __future__ import annotations

import functools

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


# The activation of each ``model.ffn`` value that `FeedForward` computes, and where it comes
# from. The values are Hugging Face's names (transformers' ACT2FN, CTranslate2's converter),
# which the MarianMT export writes as its activation_function
# (transformer/interop/marian_export.py).
ACTIVATIONS = {
    'relu': (jax.nn.relu, 'Sec. 3.3: max(0, x)'),
    # x sigmoid(x): SiLU (Elfwing et al., 2018), Swish (Ramachandran et al., 2017).
    'swish': (jax.nn.silu, 'x sigmoid(x) (Ramachandran et al., 2017); Hugging Face "swish"'),
    # Hugging Face's "gelu" is torch's exact GELU, x Phi(x) with erf; jax's default is the
    # tanh approximation, which differs by up to ~5e-4.
    'gelu': (
        functools.partial(jax.nn.gelu, approximate=False),
        'x Phi(x), the exact erf form (Hendrycks and Gimpel, 2016); Hugging Face "gelu"',
    ),
}


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (Sec. 3.3: act = ReLU), ``act`` the `ACTIVATIONS` entry
    of ``model.ffn``; ``model.relu_dropout_rate`` drops out its hidden layer."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg = self.config
        activation, _ = ACTIVATIONS[cfg.ffn]
        h = activation(dense(cfg, cfg.d_ff, ('embed', 'mlp'), 'wi')(x))  # [B, T, F]
        h = constrain(h, HIDDEN)
        h = Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
        return dense(cfg, x.shape[-1], ('mlp', 'embed'), 'wo')(h)


def _weights(cfg: TransformerConfig) -> variants.Shapes:
    """Two biased projections, [D, F] and [F, D], whatever the activation."""
    return {
        'wi/kernel': (cfg.d_model, cfg.d_ff),
        'wi/bias': (cfg.d_ff,),
        'wo/kernel': (cfg.d_ff, cfg.d_model),
        'wo/bias': (cfg.d_model,),
    }


RELU, SWISH, GELU = (
    variants.register(variants.Variant('ffn', name, _weights, source, module=FeedForward))
    for name, (_, source) in ACTIVATIONS.items()
)


def projection(cfg: TransformerConfig, features: int, axes: tuple[str, str], name: str):
    """A projection without a bias (the gated feed-forwards'), Glorot-uniform kernel."""
    return nn.Dense(
        features,
        use_bias=False,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes),
        dot_general=backends.dense_dot_general,
        name=name,
    )


# The gate's activation of each gated ``model.ffn`` value (Shazeer, 2020, "GLU Variants
# Improve Transformer"): SwiGLU's Swish_1 = x sigmoid(x); GeGLU's GELU in its exact erf form,
# x Phi(x), as 'gelu' above and CTranslate2's Activation.GELU compute it; or in its tanh
# approximation, T5 v1.1's and MADLAD-400's (Hugging Face's "gated-gelu", whose gate is
# "gelu_new").
GATES = {'swiglu': 'swish', 'geglu': 'gelu', 'geglu_tanh': 'gelu_tanh'}
# The activations only a gate takes.
GATE_ACTIVATIONS = {
    **ACTIVATIONS,
    'gelu_tanh': (
        functools.partial(jax.nn.gelu, approximate=True),
        '0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); Hugging Face "gelu_new"',
    ),
}


class GatedFeedForward(nn.Module):
    """FFN(x) = (act(x W0) * (x W1)) W2 (Shazeer, 2020), no biases (as there): three [D, F] /
    [F, D] matrices, 1.5x the two of `FeedForward` at the same d_ff. ``act``: `GATES`.
    ``model.relu_dropout_rate`` drops out the gated hidden layer."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg = self.config
        activation, _ = GATE_ACTIVATIONS[GATES[cfg.ffn]]
        gate = activation(projection(cfg, cfg.d_ff, ('embed', 'mlp'), 'wi_0')(x))  # [B, T, F]
        h = constrain(gate * projection(cfg, cfg.d_ff, ('embed', 'mlp'), 'wi_1')(x), HIDDEN)
        h = Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
        return projection(cfg, x.shape[-1], ('mlp', 'embed'), 'wo')(h)


def _gated_weights(cfg: TransformerConfig) -> variants.Shapes:
    """Three projections without biases: the gate and the linear [D, F], the output [F, D]."""
    return {
        'wi_0/kernel': (cfg.d_model, cfg.d_ff),
        'wi_1/kernel': (cfg.d_model, cfg.d_ff),
        'wo/kernel': (cfg.d_ff, cfg.d_model),
    }


SWIGLU, GEGLU, GEGLU_TANH = (
    variants.register(
        variants.Variant(
            'ffn',
            name,
            _gated_weights,
            f'Shazeer (2020): {gate} gate, three matrices, no biases',
            module=GatedFeedForward,
        )
    )
    for name, gate in GATES.items()
)
