"""How a step's arrays (parameters, optimizer state) are written and read back: within the
memory bound training checks first (`training.memory_needs`), which holds the train state
(parameters and Adam's two moments) and one more float32 copy of the parameters (their
gradient), so a save or a restore may hold at most that copy beyond the state.

Written uncompressed. Orbax hands TensorStore each array's host buffer, on a CPU the array
itself (no copy); with zstd, TensorStore also held each array compressed, most of another
state at the peak, for files a few percent smaller (the figures: benchmarks/README.md,
``large_vocab_checkpoint.py``). Steps saved compressed before read as they did: the codec
is in each array's own metadata.

Read back in batches, the largest leaves first. Orbax reads a leaf into a host buffer of
its own and then copies it onto its device, and reads all leaves of a restore at once: the
state twice over at the peak. A batch holds at most the largest leaf's bytes
(`MIN_BATCH_BYTES` at least, so that a small model restores in one call), so the peak is
the state restored so far and twice the batch in flight: with the largest batches first,
at most the whole state and one largest leaf.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

PyTree = Any

# The items of a step that hold arrays (the third, ``meta``, is JSON).
ARRAY_ITEMS = ('params', 'opt_state')
# The least a restore reads per call (each call reads the step's metadata again): a model
# whose state is smaller restores in one call.
MIN_BATCH_BYTES = 64 * 2**20


def handler_registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    """The handlers of a step's items: arrays written uncompressed, ``meta`` as JSON."""
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for item in ARRAY_ITEMS:
        handler = ocp.PyTreeCheckpointHandler(use_compression=False)
        registry.add(item, ocp.args.PyTreeSave, handler)
        registry.add(item, ocp.args.PyTreeRestore, handler)
    meta = ocp.JsonCheckpointHandler()
    registry.add('meta', ocp.args.JsonSave, meta)
    registry.add('meta', ocp.args.JsonRestore, meta)
    return registry


def save_args(tree: PyTree) -> ocp.args.PyTreeSave:
    """What `ocp.CheckpointManager.save` takes for one of `ARRAY_ITEMS`."""
    return ocp.args.PyTreeSave(tree)


def _restore_args(target: PyTree) -> ocp.args.PyTreeRestore:
    """Restores the leaves of ``target`` (abstract: shape, dtype, sharding) that are not
    ``ocp.PLACEHOLDER`` into its shardings."""
    return ocp.args.PyTreeRestore(
        target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)
    )


def _nbytes(leaf: Any) -> int:
    return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


def batches(sizes: list[int]) -> list[list[int]]:
    """The leaves (indices into ``sizes``, their bytes) a restore reads per call: largest
    first, each batch at most max(the largest leaf, `MIN_BATCH_BYTES`) bytes."""
    budget = max([MIN_BATCH_BYTES, *sizes])
    groups: list[list[int]] = [[]]
    held = 0
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if groups[-1] and held + sizes[i] > budget:
            groups.append([])
            held = 0
        groups[-1].append(i)
        held += sizes[i]
    return groups


def restore(
    manager: ocp.CheckpointManager,
    step: int,
    targets: Mapping[str, PyTree],
    **others: ocp.args.CheckpointArgs,
) -> dict[str, Any]:
    """The items of ``step``: each of ``targets`` (an item of `ARRAY_ITEMS` -> its abstract
    tree) restored into its shardings in batches (module docstring), and ``others`` (e.g.
    ``meta=ocp.args.JsonRestore()``) with the first batch."""
    flat = {name: jax.tree.flatten(tree) for name, tree in targets.items()}
    leaves = [(name, i) for name, (values, _) in flat.items() for i in range(len(values))]
    sizes = [_nbytes(flat[name][0][i]) for name, i in leaves]
    restored = {name: list(values) for name, (values, _) in flat.items()}
    others_restored: dict[str, Any] = {}
    groups = batches(sizes)
    for n, batch in enumerate(groups):
        wanted: dict[str, set[int]] = {}
        for k in batch:
            wanted.setdefault(leaves[k][0], set()).add(leaves[k][1])
        args = {
            name: _restore_args(
                flat[name][1].unflatten(
                    [v if i in indices else ocp.PLACEHOLDER for i, v in enumerate(flat[name][0])]
                )
            )
            for name, indices in wanted.items()
        }
        got = manager.restore(step, args=ocp.args.Composite(**args, **(others if n == 0 else {})))
        if n == 0:
            others_restored = {name: got[name] for name in others}
        for name, indices in wanted.items():
            values = flat[name][1].flatten_up_to(got[name])
            for i in indices:
                restored[name][i] = values[i]
        # Orbax's host buffers live on until the copies onto the devices finish and the
        # cycles holding them are collected: left to later, the next batch joined them. A
        # full collection takes a large process a fraction of a second, so the last batch's
        # buffers (at most one batch, within the bound) are left to the next one Python runs.
        jax.block_until_ready([restored[name] for name in wanted])
        del got, values
        if n + 1 < len(groups):
            gc.collect()
    return others_restored | {name: flat[name][1].unflatten(restored[name]) for name in flat}
