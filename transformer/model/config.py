"""The model's hyper-parameters: `TransformerConfig`, and its making from a config file's
``model`` section. Kept apart from transformer/model/transformer.py so that the layers can name the
config without importing the network built from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

from transformer.model.attention import ATTENTION_IMPLS


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the model; defaults are the paper's base model (Table 3)."""

    vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    head_dim: int | None = None  # d_k = d_v; None = d_model // num_heads (Sec. 3.2.2)
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout_rate: float = 0.1  # residual + embedding dropout, P_drop (Sec. 5.4)
    attention_dropout_rate: float = 0.0  # on attention probabilities (not in the paper)
    relu_dropout_rate: float = 0.0  # inside the FFN, after the ReLU (not in the paper)
    max_len: int = 256  # longest sequence the data pipeline and decoder caches produce
    # 'all': source, target and pre-softmax share one matrix (joint vocabulary, Sec. 3.4);
    # 'target': target embedding == pre-softmax projection, separate source embedding;
    # 'none': three separate matrices.
    share_embeddings: Literal['all', 'target', 'none'] = 'all'
    pre_layer_norm: bool = False  # False = post-LN as in the paper; True = pre-LN + final LN
    layer_norm_epsilon: float = 1e-6
    # 'einsum': explicit logits + masked softmax (sows attention weights, for visualize);
    # 'fused': jax.nn.dot_product_attention (cuDNN flash attention on NVIDIA GPUs).
    attention_impl: Literal['einsum', 'fused'] = 'einsum'
    dtype: Any = jnp.float32  # computation dtype
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.share_embeddings not in ('all', 'target', 'none'):
            raise ValueError(
                f"share_embeddings must be 'all', 'target' or 'none', got "
                f'{self.share_embeddings!r}.'
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f'attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}.'
            )
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f'd_model={self.d_model} is not divisible by num_heads={self.num_heads}; '
                'set head_dim explicitly.'
            )


# Computation and parameter dtypes a config may name.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


def config_from_dict(model: Mapping[str, Any], vocab_size: int) -> TransformerConfig:
    """A TransformerConfig from a config file's ``model`` section (one key per field).

    ``dtype`` / ``param_dtype`` may be given by name ('float32', 'bfloat16'); unknown keys fail
    with the list of valid ones.
    """
    fields = {f.name for f in dataclasses.fields(TransformerConfig)} - {'vocab_size'}
    kwargs = dict(model)
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise ValueError(f'Unknown model config keys {unknown}; valid keys: {sorted(fields)}.')
    for key in ('dtype', 'param_dtype'):
        if isinstance(kwargs.get(key), str):
            if kwargs[key] not in DTYPES:
                raise ValueError(
                    f'model.{key} must be one of {sorted(DTYPES)}, got {kwargs[key]!r}.'
                )
            kwargs[key] = DTYPES[kwargs[key]]
    return TransformerConfig(vocab_size=vocab_size, **kwargs)
