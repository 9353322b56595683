"""Which step a training run resumes from, and the restore into its train state: the newest
step that passes its checks; newer ones that fail are moved to ``WORKDIR/corrupt_checkpoints/``
(transformer/checkpoint/__init__.py, "Integrity", says why)."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from transformer import multihost
from transformer.checkpoint import arrays
from transformer.checkpoint.directory import (
    RESTORE_ERRORS,
    CorruptCheckpoint,
    check_params_fit,
    is_sealed,
    is_stacked,
    restore_error,
    saved_params,
    verify_step,
)
from transformer.model import STACKED_KEYS, convert_layer_layout
from transformer.rundir import (
    CORRUPT_CHECKPOINTS,
    MANIFEST,
    WorkdirError,
    error_line,
    path,
    step_dir,
)

PyTree = Any


class TrainState(Protocol):
    """What a training checkpoint holds of the train state (a dataclass with these fields,
    transformer/training/steps.py's `TrainState`)."""

    step: jax.Array
    params: PyTree
    opt_state: PyTree


State = TypeVar('State', bound=TrainState)


class RestoreFailed(WorkdirError):
    """A step that could not be restored into the train state; ``reason``: the first line of
    what Orbax raised."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def restore_state(
    manager: ocp.CheckpointManager, step: int, abstract_state: State, workdir: str
) -> tuple[State, dict[str, Any]]:
    """The train state saved at ``step`` (into the layout of ``abstract_state``) and its meta;
    `restore_latest` verifies the step first."""
    saved = saved_params(workdir, step)
    stacked = is_stacked(saved)
    scanned = STACKED_KEYS[0] in abstract_state.params  # this run's layout of the layers
    if stacked is not None and stacked != scanned:
        return _restore_converted(manager, step, abstract_state, workdir, stacked)
    try:
        check_params_fit(saved, abstract_state.params)
        restored = arrays.restore(
            manager,
            step,
            {'params': abstract_state.params, 'opt_state': abstract_state.opt_state},
            meta=ocp.args.JsonRestore(),
        )
    except RESTORE_ERRORS as e:
        raise RestoreFailed(
            f'{restore_error(workdir, step, e, "this config (model or optimizer changed?)")}. '
            'Resume with the config the run was started with, or use a new --workdir.',
            reason=error_line(e),
        ) from None
    state = dataclasses.replace(
        abstract_state,
        step=jnp.array(restored['meta']['step'], jnp.int32),
        params=restored['params'],
        opt_state=restored['opt_state'],
    )
    return state, restored['meta']


def _restore_converted(
    manager: ocp.CheckpointManager, step: int, abstract_state: State, workdir: str, stacked: bool
) -> tuple[State, dict[str, Any]]:
    """`restore_state` of a step saved in the other layout of the layers (model.scan_layers):
    the parameters and optimizer state restored in it on this process's first device, then
    converted and placed in ``abstract_state``'s shardings (one line says so)."""
    trees = (abstract_state.params, abstract_state.opt_state)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    saved = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        jax.eval_shape(lambda t: convert_layer_layout(t, stacked), trees),
    )
    saved_state = dataclasses.replace(abstract_state, params=saved[0], opt_state=saved[1])
    state, meta = restore_state(manager, step, saved_state, workdir)
    converted = convert_layer_layout((state.params, state.opt_state), not stacked)
    placed = jax.tree.map(
        lambda x, target: jax.make_array_from_callback(
            target.shape, target.sharding, lambda index, x=x: np.asarray(x)[index]
        ),
        converted,
        trees,
    )
    logging.info(
        'Step %d was saved with model.scan_layers=%s: parameters and optimizer state '
        "converted to this run's layout.",
        step,
        stacked,
    )
    return dataclasses.replace(state, params=placed[0], opt_state=placed[1]), meta


def restore_latest(
    manager: ocp.CheckpointManager, workdir: str, abstract_state: State, writes: bool
) -> tuple[State, dict, int] | None:
    """(state, meta, step) of the newest intact step; None when there is no checkpoint.

    Process 0 (``writes``) chooses the step: the newest whose files match its manifest; newer
    steps that do not are moved to ``WORKDIR/corrupt_checkpoints/`` (their step numbers will
    be saved again) with a one-line warning. Every process then restores it. A step without
    manifest that cannot be restored is moved there too, once an older step has restored
    with this config (so that its files, not the config, are at fault); a config that fits
    no step stops the run and moves nothing.
    """
    unreadable: list[tuple[int, RestoreFailed]] = []
    below = None
    while True:
        choose = functools.partial(newest_intact, manager, workdir, below, writes)
        step = multihost.on_main(choose, 'verify the checkpoints')
        manager.reload()  # process 0 may have moved steps away (on_main waited)
        if step is None:
            if unreadable:
                raise unreadable[0][1]
            return None
        sealed = is_sealed(workdir, step)
        error = None
        try:
            state, meta = restore_state(manager, step, abstract_state, workdir)
        except RestoreFailed as e:
            error = e
        if multihost.all_ok(error is None):
            break
        error = error or RestoreFailed(
            f'Another process could not restore checkpoint step {step}; its log says why.',
            reason='read on another process',
        )
        if sealed:  # its files are as they were written: the config does not fit them
            raise error
        unreadable.append((step, error))
        below = step
    if unreadable:
        quarantine(workdir, [s for s, _ in unreadable], writes)
        multihost.barrier('checkpoints-quarantined')
        manager.reload()
        for bad, error in unreadable:
            logging.warning(
                'Checkpoint step %d (no manifest) could not be read (%s); moved to %s/. '
                'Resuming from step %d, which restores with this config.',
                *(bad, error.reason, CORRUPT_CHECKPOINTS, step),
            )
    if not sealed:
        logging.warning(
            'Checkpoint step %d has no %s (saved before checksums were kept, or its run '
            'was killed before sealing it): it restored completely but stays unverified.',
            *(step, MANIFEST),
        )
    return state, meta, step


def newest_intact(
    manager: ocp.CheckpointManager, workdir: str, below: int | None, writes: bool
) -> int | None:
    """Process 0: the newest step (below ``below``) that matches its manifest or has none;
    newer ones that fail verification are quarantined."""
    steps = sorted(manager.all_steps(), reverse=True)
    steps = [s for s in steps if below is None or s < below]
    failed: list[CorruptCheckpoint] = []
    for step in steps:
        try:
            verify_step(workdir, step, warn=False)
            break
        except CorruptCheckpoint as e:
            failed.append(e)
    else:
        if not steps:
            return None
        raise WorkdirError(f'{failed[0]} No intact checkpoint to resume from: {steps}.')
    if failed:
        quarantine(workdir, steps[: len(failed)], writes)
        logging.warning('%s Resuming from step %d, the newest intact one.', failed[0], step)
    return step


def quarantine(workdir: str, steps: Sequence[int], writes: bool) -> None:
    """Moves ``steps`` to ``WORKDIR/corrupt_checkpoints/`` (process 0, ``writes``; every
    process then reloads its step list once all have reached this point)."""
    if writes:
        target = path(workdir, CORRUPT_CHECKPOINTS)
        os.makedirs(target, exist_ok=True)
        for step in steps:
            destination = tempfile.mkdtemp(prefix=f'{step}-', dir=target)
            shutil.move(step_dir(workdir, step), destination)
