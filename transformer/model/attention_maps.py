"""The attention weights a model computes for one sentence pair, every head of every layer:
what visualize draws and what the Python API returns."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import layer_stack
from transformer.model.transformer import Transformer

KINDS = (
    ('encoder', 'self_attention', 'encoder self'),
    ('decoder', 'self_attention', 'decoder self'),
    ('decoder', 'cross_attention', 'cross'),
)


@functools.partial(jax.jit, static_argnames='model')
def _sown(model: Transformer, params: Any, inputs: jax.Array, targets: jax.Array) -> Any:
    """The forward pass's sown intermediates, compiled as one program (run eagerly, each of
    its operations is compiled on its own, which costs more than the whole program) and
    reused by later calls of the same model and shapes."""
    _, variables = model.apply({'params': params}, inputs, targets, mutable=['intermediates'])
    return variables


def attention_maps(
    model: Transformer, params: Any, inputs: np.ndarray, targets: np.ndarray
) -> dict[tuple[str, int, str], np.ndarray]:
    """{(stack, layer, kind): [N, T, S] probabilities} for one (unpadded) example.

    Args:
      model: the Transformer.
      params: its parameters.
      inputs: source ids [S] ending with EOS.
      targets: target ids [T] ending with EOS.
    """
    # Only the explicit einsum path forms (and sows) the attention matrices; the layers one
    # by one (a scanned model's parameters unstacked: layer_stack.py), each its own maps.
    config = dataclasses.replace(model.config, attention_impl='einsum', scan_layers=False)
    model, params = model.clone(config=config), layer_stack.unstack(params)
    variables = _sown(model, params, jnp.asarray(inputs)[None], jnp.asarray(targets)[None])
    maps = {}
    for name, layer in variables['intermediates'].items():
        stack, _, index = name.rpartition('_layer_')
        for kind, sown in layer.items():
            if 'attention_weights' in sown:
                maps[(stack, int(index), kind)] = np.asarray(sown['attention_weights'][0][0])
    return maps
