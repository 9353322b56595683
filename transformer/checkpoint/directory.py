"""A run's checkpoint directories on disk: the Orbax manager of ``WORKDIR/checkpoints`` (or
``WORKDIR/best``), the manifest that seals a step and its check, and the one-line errors of
a step that cannot be read. The rules these follow are the package docstring's
(transformer/checkpoint/__init__.py, "Integrity")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from transformer import schema
from transformer.checkpoint import arrays, checksums
from transformer.model import STACKED_KEYS
from transformer.rundir import (
    BEST,
    CHECKPOINTS,
    MANIFEST,
    WorkdirError,
    error_line,
    path,
    step_dir,
    wrong_kind,
)

PyTree = Any

# What Orbax raises for a checkpoint that is missing pieces or does not fit the target tree
# (ValueError, KeyError, TypeError, FileNotFoundError), and for a file TensorStore cannot read
# (a plain Exception): every one becomes a one-line error naming the step.
RESTORE_ERRORS = (Exception,)


class CorruptCheckpoint(WorkdirError):
    """A checkpoint step whose files differ from its manifest."""


class CheckpointRemoved(WorkdirError):
    """A checkpoint step deleted while it was read (a training run keeps only its last K)."""


def removed_error(workdir: str, step: int, best: bool) -> CheckpointRemoved | None:
    """The error to raise instead of a read's when the step's directory is gone."""
    if os.path.isdir(step_dir(workdir, step, best=best)):
        return None
    where = BEST if best else CHECKPOINTS
    return CheckpointRemoved(
        f'Checkpoint step {step} in {workdir}/{where} was removed while being read (a run '
        'still training there keeps only its last train.keep_checkpoints steps).'
    )


def save_replicas_whole() -> None:
    """On a CPU, Orbax saves each replicated array from one device, whole. Its default off a
    GPU is replica-parallel saving, which cuts a replicated array into one slice per device,
    each an eager ``lax.slice`` compiled for its shape, so that several devices copy to the
    host at once: on a CPU the copy is within host memory and gains nothing, and the first
    save of a tiny model replicated over 8 devices compiled 56 such programs (66 compilations
    in the whole run against 10 without them). GPUs (where Orbax turns it off itself) and TPUs
    keep Orbax's choice. The handler is the process's, shared by every save."""
    if jax.default_backend() != 'cpu':
        return
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    if getattr(handler, '_use_replica_parallel', False):
        handler._use_replica_parallel = False  # no public setter; a rename only costs time


def checkpoint_manager(
    workdir: str,
    config: schema.Experiment | None = None,
    *,
    best: bool = False,
) -> ocp.CheckpointManager:
    """``WORKDIR/checkpoints`` (``best``: ``WORKDIR/best``): for writing (``config`` given: its
    keep / async settings) or, without ``config``, read-only."""
    directory = path(os.path.abspath(workdir), BEST if best else CHECKPOINTS)
    if config is None:
        if not os.path.isdir(directory):
            what = 'best checkpoint (eval.bleu_every was 0?)' if best else 'checkpoints'
            why = wrong_kind(directory, directory=True) or f'{directory} does not exist'
            raise WorkdirError(f'No {what} in {workdir}: {why}.')
        options = ocp.CheckpointManagerOptions(read_only=True, create=False)
    else:
        save_replicas_whole()
        keep = max(config.train.keep_checkpoints, config.eval.average_last)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=1 if best else keep,
            enable_async_checkpointing=config.train.async_checkpointing,
            # A step directory that cannot be made (read-only, full disk) fails in save()
            # itself: made in the background, the failure left Orbax's other save threads
            # waiting 300 s for it, and the process could not exit until then.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
            create=True,
            # A save killed half-way leaves `<step>.orbax-checkpoint-tmp-*`, never read again.
            cleanup_tmp_directories=True,
        )
    return ocp.CheckpointManager(
        directory, options=options, handler_registry=arrays.handler_registry()
    )


def read_meta(workdir: str, step: int) -> dict[str, Any]:
    """The meta a training run saved with ``step``: the step, the data position, the seed and
    the best-checkpoint tracker's state (transformer/training/best.py)."""
    manager = checkpoint_manager(workdir)
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']


def restore_error(workdir: str, step: int, error: Exception, what: str) -> WorkdirError:
    first_line = error_line(error)
    return WorkdirError(
        f'The checkpoint at step {step} in {workdir}/{CHECKPOINTS} does not fit {what} or is '
        f'incomplete: {first_line}'
    )


def saved_params(workdir: str, step: int, *, best: bool = False) -> PyTree | None:
    """The metadata tree (shapes, no values) of the parameters saved at ``step``, or None
    where it cannot be read (the restore then says what is wrong). Read once per restore:
    `is_stacked` and `check_params_fit` take it."""
    item = epath.Path(step_dir(workdir, step, best=best)) / 'params'
    try:
        return ocp.StandardCheckpointHandler().metadata(item)
    except Exception:  # noqa: BLE001 - no readable metadata: the restore says what is wrong
        return None


def check_params_fit(saved: PyTree | None, params: PyTree) -> None:
    """ValueError naming the first parameter whose ``saved`` shape (`saved_params`) differs
    from abstract ``params``, before any array is read (a restore failing half-way left
    tensorstore reads in flight, which printed tracebacks after the error line)."""
    if saved is None:
        return
    have, want = (
        {jax.tree_util.keystr(k): tuple(v.shape) for k, v in _leaves(t)} for t in (saved, params)
    )
    differ = sorted(set(have) ^ set(want)) or [k for k in want if have[k] != want[k]]
    if differ:
        key = differ[0]
        raise ValueError(
            f'params{key} is {have.get(key, "absent")} there, {want.get(key, "absent")} here'
        )


def is_stacked(saved: PyTree | None) -> bool | None:
    """Whether ``saved`` (`saved_params`) holds a scanned model's stacked layers
    (``encoder_layers``: model.scan_layers); None where the metadata could not be read."""
    return None if saved is None else any(key in saved for key in STACKED_KEYS)


def _leaves(tree: PyTree) -> list:
    return jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, 'shape'))


def seal_step(workdir: str, step: int, *, best: bool = False) -> None:
    """Writes the manifest of a finished step: size and sha256 of each of its files."""
    checksums.write(step_dir(workdir, step, best=best), MANIFEST)


def is_sealed(workdir: str, step: int) -> bool:
    """Whether ``WORKDIR/checkpoints/<step>`` has a manifest (its files are not checked)."""
    return os.path.exists(os.path.join(step_dir(workdir, step), MANIFEST))


def verify_step(
    workdir: str,
    step: int,
    items: Sequence[str] | None = None,
    *,
    warn: bool = True,
    best: bool = False,
) -> bool:
    """Checks a step's files against its manifest before anything reads them.

    Args:
      workdir: the run directory.
      step: the checkpoint step.
      items: check only these Orbax items (e.g. ``('params',)``) and the step's own files.
      warn: log a one-line warning for a step without manifest.
      best: the step of ``WORKDIR/best`` instead of ``WORKDIR/checkpoints``.

    Returns:
      True when verified, False when the step has no manifest (accepted unverified; see
      transformer/checkpoint/__init__.py, "Integrity").

    Raises:
      CorruptCheckpoint: a file is missing or differs from the manifest.
    """
    try:
        sealed = checksums.verify(step_dir(workdir, step, best=best), MANIFEST, items)
    except checksums.Mismatch as e:
        where = BEST if best else CHECKPOINTS
        raise CorruptCheckpoint(
            f'Checkpoint step {step} in {workdir}/{where} failed verification: '
            f'{where}/{step}/{e} and cannot be used.'
        ) from None
    if not sealed and warn:
        logging.warning(
            'Checkpoint step %d in %s/%s has no %s (saved before checksums were kept, or its '
            'run stopped before sealing it); loading it unverified.',
            *(step, workdir, CHECKPOINTS, MANIFEST),
        )
    return sealed
