"""Sharding constraints on activations, by logical axis names.

The parameters declare logical axes where they are created ('embed', 'heads', 'kv', 'mlp',
'vocab'); the activations name theirs here: 'batch' (B), 'length' (T or S), 'embed' (D)
between the layers, 'heads' (N) and 'kv' (H) for the attention's queries, keys and values,
'mlp' (F) for the feed-forward's hidden layer. One rules table maps both onto mesh axes
(transformer/training/parallel.py `rules`). Where no rules are set (pmap mode, one device,
decoding and every call outside the train and eval steps) a constraint does nothing.
"""

from __future__ import annotations

import jax
from flax import linen as nn

# Every layer's input and output, [B, T, D].
BETWEEN_LAYERS = ('batch', 'length', 'embed')
# The attention's queries, keys and values, [B, T, N, H].
HEADS = ('batch', 'length', 'heads', 'kv')
# The feed-forward's hidden layer, [B, T, F].
HIDDEN = ('batch', 'length', 'mlp')


def constrain(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` laid out as the rules in force place the logical ``axes`` (none: ``x``)."""
    return nn.with_logical_constraint(x, axes)
