"""Reading device results on the host without hanging on a failed computation."""

from __future__ import annotations

from typing import Any

import jax

PyTree = Any


def fetch(tree: PyTree) -> PyTree:
    """``jax.device_get`` that raises the error of a computation that failed (e.g. out of
    memory) instead of waiting for ever: jaxlib's CPU client never wakes a host read of an
    output whose computation failed, while ``block_until_ready`` raises its error."""
    return jax.device_get(jax.block_until_ready(tree))
