"""docs/nnx.md's claim, checked: a norm written in Flax NNX and wrapped by
``flax.nnx.bridge.to_linen`` is registered as a norm kind (an entry and its module, nothing
else) and the model keeps its parameter paths and shapes and computes the same logits from
the same parameters as with the Linen LayerNorm."""

import flax
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from flax.nnx import bridge

from tests.random_params import fill_random
from transformer.model import (
    Transformer,
    TransformerConfig,
    abstract_params,
    teacher_forced_logits,
    variants,
)

SMALL = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=24, attention_impl='einsum')
SMALL |= dict(num_encoder_layers=1, num_decoder_layers=1)


def _nnx_layer_norm(cfg, name):
    return bridge.to_linen(nnx.LayerNorm, cfg.d_model, epsilon=cfg.layer_norm_epsilon, name=name)


@pytest.fixture
def nnx_norm():
    previous = flax.config.flax_always_shard_variable
    flax.config.update('flax_always_shard_variable', False)
    shapes = lambda cfg: {'scale': (cfg.d_model,), 'bias': (cfg.d_model,)}  # noqa: E731
    variants.register(variants.Variant('norm', 'nnx', shapes, 'test', module=_nnx_layer_norm))
    yield
    variants.unregister('norm', 'nnx')
    flax.config.update('flax_always_shard_variable', previous)


@pytest.mark.parametrize('pre_layer_norm', [False, True])
def test_an_nnx_norm_through_the_bridge_keeps_paths_and_logits(nnx_norm, pre_layer_norm):
    linen = Transformer(TransformerConfig(**SMALL, pre_layer_norm=pre_layer_norm))
    bridged = Transformer(TransformerConfig(**SMALL, pre_layer_norm=pre_layer_norm, norm='nnx'))

    def paths(model):
        leaves = jax.tree_util.tree_leaves_with_path(abstract_params(model))
        return {jax.tree_util.keystr(k): (v.shape, v.dtype) for k, v in leaves}

    assert paths(bridged) == paths(linen)
    params = fill_random(abstract_params(linen))
    inputs, targets = jnp.array([[5, 6, 7, 1]]), jnp.array([[8, 9, 1]])
    # Compiled: the bridge's modules run op by op cost more than compiling both programs.
    logits = jax.jit(teacher_forced_logits, static_argnums=0)
    want = logits(linen, params, inputs, targets)
    got = logits(bridged, params, inputs, targets)
    assert jnp.array_equal(got, want)
