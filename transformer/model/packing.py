"""Packing as the model sees it: several examples share a row, told apart by their segments.

A packed training batch (transformer/data/packing.py) holds, beside the tokens, each token's
example id in its row (segmentation: 1, 2, ... and 0 for padding) and its position within that
example, for the source and the target side. `Packing` carries the four arrays as one value
through the model's entry points (`Transformer.encode`, `decode`, `__call__`); None means one
example a row, positions 0, 1, 2, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax

Array = jax.Array


class Packing(NamedTuple):
    """Segments and positions of a packed batch: [B, S] for the source, [B, T] for the target."""

    inputs_segmentation: Array
    targets_segmentation: Array
    inputs_positions: Array
    targets_positions: Array

    @classmethod
    def of(cls, batch: Mapping[str, Any]) -> Packing | None:
        """The packing of a batch dict that has the four keys of the fields' names (a packed
        training batch), else None (one example a row: evaluation batches)."""
        if not all(batch.get(key) is not None for key in cls._fields):
            return None
        return cls(*(batch[key] for key in cls._fields))
