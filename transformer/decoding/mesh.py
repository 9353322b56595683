"""Decoding on every device of a run's mesh and over its processes: where a search runs.

A batch's sentences are split over the mesh's ``data`` axis, as training splits its batch:
every process holds the whole batch (the same evaluation set, or the lines process 0 read),
pads its rows to a multiple of the ``data`` axis with filler rows (source ``[EOS]``, as the
evaluation batches' own filler, so no row is fully masked), and places only its own block of
rows (`DecodeLayout.process_groups`; processes whose devices share their ``data`` indices
place the same block). The search (`decode`'s ``search``, with its options) runs as one
program over the mesh on these global rows and the parameters in the training layout: a
replicated run stays replicated over ``data``, an FSDP or model-axis run stays sharded and
XLA inserts the collectives each step needs (docs/parallelism.md counts them).
``gather_params`` all-gathers the parameters once, before decoding, instead. The outputs are
gathered onto every process and the filler rows dropped, so every process holds every
hypothesis and computes the same score from them.

The layout itself (the mesh, the rules that place each parameter) is training's
(transformer/training/decode_layout.py builds a `DecodeLayout` from a run's parallel settings);
this module only uses it. Without a layout (``None``) a search runs where its inputs are, on
this process's first device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.backends import fetch
from transformer.decoding.next_token import Ensemble
from transformer.model import Transformer
from transformer.tokens import JOINT, SpecialIds

PyTree = Any


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
    """Where a decode runs: a ('data', 'model') mesh, the parameters' shardings on it and the
    block of a batch's rows each process places."""

    mesh: jax.sharding.Mesh
    param_shardings: PyTree  # NamedShardings of one model's parameters (training's layout)
    # Process index -> (its block, the number of blocks) of a batch's rows: training's
    # `parallel.data_groups` of the mesh.
    process_groups: Mapping[int, tuple[int, int]] = dataclasses.field(
        default_factory=lambda: {0: (0, 1)}
    )
    gather_params: bool = False  # one full copy on every device, gathered before decoding

    @property
    def data_shards(self) -> int:
        """How many ways a batch's rows are split: its rows are padded to a multiple."""
        return self.mesh.shape['data']

    @property
    def devices(self) -> list:
        return list(self.mesh.devices.flat)

    @property
    def local_devices(self) -> list:
        return [d for d in self.devices if d.process_index == jax.process_index()]

    @property
    def rows_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P('data'))

    def shardings(self) -> PyTree:
        """The parameters' shardings while decoding: the training layout, or replicated on
        every device with ``gather_params``."""
        if not self.gather_params:
            return self.param_shardings
        replicated = NamedSharding(self.mesh, P())
        return jax.tree.map(lambda _: replicated, self.param_shardings)

    def place(self, params: PyTree) -> PyTree:
        """``params`` (a tree or an `Ensemble` of trees) in `shardings`; a no-op for arrays
        already there (restored into the layout by `checkpoint.load_model`)."""
        shardings = self.shardings()
        if isinstance(params, Ensemble):
            return Ensemble(tuple(jax.device_put(m, shardings) for m in params.members))
        return jax.device_put(params, shardings)

    def padded_rows(self, rows: int) -> int:
        """``rows`` rounded up to a multiple of the ``data`` axis."""
        return -(-rows // self.data_shards) * self.data_shards

    def rows_of(self, process: int, rows: int) -> range:
        """The rows [0, padded_rows) that ``process`` places."""
        group, groups = self.process_groups[process]
        block = self.padded_rows(rows) // groups
        return range(group * block, (group + 1) * block)


# The arrays of token ids a batch may hold: their filler rows are the vocabulary's padding.
_TOKEN_KEYS = ('inputs', 'targets', 'prefixes')


def filler_rows(
    batch: Mapping[str, np.ndarray], rows: int, special: SpecialIds = JOINT
) -> dict[str, np.ndarray]:
    """``batch`` with filler rows appended up to ``rows``: 'inputs' ``[EOS]`` (as the
    evaluation batches' filler, so no source is fully masked), 'targets' and 'prefixes'
    padding (``special.pad``: a filler target weighs nothing in a loss), every other array 0."""
    out = {}
    for key, value in batch.items():
        fill = special.pad if key in _TOKEN_KEYS else 0
        pad = np.full((rows - value.shape[0], *value.shape[1:]), fill, value.dtype)
        if key == 'inputs' and pad.size:
            pad[:, 0] = special.eos
        out[key] = np.concatenate([value, pad])
    return out


def place_rows(
    batch: Mapping[str, np.ndarray], layout: DecodeLayout, special: SpecialIds = JOINT
) -> dict[str, jax.Array]:
    """A whole batch (the same on every process) as global arrays split over ``data``: padded
    to a multiple of the ``data`` axis (`filler_rows`, with the vocabulary's ``special``
    ids), each process placing only its rows."""
    rows = layout.padded_rows(next(iter(batch.values())).shape[0])
    padded = filler_rows(batch, rows, special)
    own = layout.rows_of(jax.process_index(), rows)
    return {
        key: jax.make_array_from_process_local_data(
            layout.rows_sharding, value[own.start : own.stop], value.shape
        )
        for key, value in padded.items()
    }


def gather(tree: PyTree) -> PyTree:
    """Global arrays -> numpy arrays of the whole value, on every process."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, fetch(tree))
    return multihost_utils.process_allgather(jax.block_until_ready(tree), tiled=True)


def decode(
    search: Callable[..., PyTree],
    model: Transformer,
    params: PyTree,
    inputs: np.ndarray,
    layout: DecodeLayout | None = None,
    *,
    row_options: Mapping[str, np.ndarray] | None = None,
    **arguments: Any,
) -> PyTree:
    """``search(model, params, inputs, **row_options, **arguments)`` of a whole batch [B, S],
    on the mesh of ``layout`` (or on one device without it), as numpy arrays with B rows on
    every process.

    The search is any of the package's (`translate_batch`, `beam_search`, ...) or one with
    the same form: its outputs' leading axis is the batch's rows. ``row_options`` are per-row
    arrays [B, ...] (a sentence's line index), split over the mesh with the inputs (filler
    rows: `filler_rows`), and so are the per-row prefixes of a `DecodeOptions` given as
    ``options``; other ``arguments`` go to the search as they are. ``params`` must be in
    ``layout.shardings()`` (`DecodeLayout.place`).
    """
    rows = inputs.shape[0]
    per_row = {key: np.asarray(value) for key, value in (row_options or {}).items()}
    options = arguments.get('options')
    if getattr(options, 'prefixes', None) is not None:
        per_row['prefixes'] = np.asarray(options.prefixes)
    if layout is None:
        per_row = {key: jnp.asarray(value) for key, value in per_row.items()}
        outputs = search(model, params, jnp.asarray(inputs), **_rejoin(per_row, arguments))
        return jax.tree.map(np.asarray, fetch(outputs))
    placed = place_rows({'inputs': np.asarray(inputs), **per_row}, layout, model.config.special)
    with jax.set_mesh(layout.mesh):  # the searches read the data axis (`stage_sizes`)
        inputs = placed.pop('inputs')
        outputs = search(model, params, inputs, **_rejoin(placed, arguments))
    return jax.tree.map(lambda x: x[:rows], gather(outputs))


def _rejoin(per_row: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The search's keyword arguments: the placed per-row arrays, the prefixes back in the
    options they came from."""
    per_row = dict(per_row)
    if 'prefixes' in per_row:
        arguments = {
            **arguments,
            'options': arguments['options'].with_prefixes(per_row.pop('prefixes')),
        }
    return {**per_row, **arguments}


def sentences_per_process(
    batches: Sequence[Mapping[str, np.ndarray]], layout: DecodeLayout | None
) -> list[int]:
    """How many real sentences (``index`` >= 0) of ``batches`` each process decodes."""
    if layout is None:
        return [sum(int(np.sum(b['index'] >= 0)) for b in batches)]
    counts = [0] * len(layout.process_groups)
    for batch in batches:
        real = np.asarray(batch['index']) >= 0
        for process in range(len(counts)):
            own = layout.rows_of(process, real.shape[0])
            counts[process] += int(np.sum(real[own.start : min(own.stop, real.shape[0])]))
    return counts
