"""The two layouts of the layers' parameters and the one boundary between them.

Unrolled (``model.scan_layers=False``, the default): one subtree per layer,
``encoder_layer_{i}/...`` and ``decoder_layer_{i}/...``. Scanned (``model.scan_layers=True``):
one subtree per stack, ``encoder_layers/...`` and ``decoder_layers/...``, each leaf stacked on
a leading layer axis [L, ...] (layer i's values at index i), which `Transformer` runs as one
`nn.scan`. `stack` and `unstack` turn one into the other for any tree keyed like the
parameters (the parameters, Adam's moments, a checkpoint's), so that what reads the per-layer
tree (parameter counts, exports, attention maps) need not know the scanned one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

STACKS = ('encoder', 'decoder')
# The logical name of the stacked parameters' leading axis (replicated: every device holds
# every layer of its shard, transformer/training/parallel.py).
LAYER_AXIS = 'layers'
_LAYER = re.compile(r'^(encoder|decoder)_layer_(\d+)$')


def stacked_name(stack: str) -> str:
    """The scanned layout's key of ``stack``'s layers: 'encoder_layers'."""
    return f'{stack}_layers'


# The top-level keys of the scanned layout's stacked layers.
STACKED_KEYS = tuple(stacked_name(s) for s in STACKS)


def stack(tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree`` with its ``{stack}_layer_{i}`` subtrees replaced by one ``{stack}_layers``
    whose leaves are layer 0's, 1's, ... stacked on a new leading axis; other keys as they
    are. A tree already stacked is returned as it is."""
    out, layers = {}, {s: {} for s in STACKS}
    for key, value in tree.items():
        match = _LAYER.match(key)
        if match:
            layers[match[1]][int(match[2])] = value
        else:
            out[key] = value
    for name, found in layers.items():
        if found:
            if sorted(found) != list(range(len(found))):
                raise ValueError(f'{name} layers {sorted(found)} are not 0 .. {len(found) - 1}.')
            ordered = [found[i] for i in range(len(found))]
            out[stacked_name(name)] = jax.tree.map(lambda *xs: jnp.stack(xs), *ordered)
    return out


def unstack(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `stack`: each ``{stack}_layers`` subtree split along its leading axis
    into ``{stack}_layer_{i}``. A tree already unrolled is returned as it is."""
    out = {}
    for key, value in tree.items():
        name = next((s for s in STACKS if key == stacked_name(s)), None)
        if name is None:
            out[key] = value
            continue
        count = jax.tree.leaves(value)[0].shape[0]
        for i in range(count):
            out[f'{name}_layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], value)
    return out


def to_layout(tree: Mapping[str, Any], scanned: bool) -> dict[str, Any]:
    """``tree`` in the scanned layout or in the unrolled one."""
    return stack(tree) if scanned else unstack(tree)


def _holds_layers(node: Any) -> bool:
    return isinstance(node, Mapping) and any(
        _LAYER.match(str(k)) or k in STACKED_KEYS for k in node
    )


def convert(tree: Any, scanned: bool) -> Any:
    """``tree`` with every mapping that holds layers (the parameters, and each Adam moment of
    an optimizer state) in the scanned layout or the unrolled one; ``jax.eval_shape`` of it
    gives the shapes of the other layout's tree."""
    return jax.tree.map(
        lambda node: to_layout(node, scanned) if _holds_layers(node) else node,
        tree,
        is_leaf=_holds_layers,
    )
