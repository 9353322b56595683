"""The trainer's checkpoints: saves sealed with a manifest, resumes that never start from a
step that failed its checks (see transformer/workdir.py, "Integrity", for the scheme)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from transformer.steps import TrainState, resumed_prng_warning
from transformer.workdir import (
    CHECKPOINTS,
    CONFIG_FILE,
    CORRUPT_CHECKPOINTS,
    MANIFEST,
    RESTORE_ERRORS,
    CorruptCheckpoint,
    PyTree,
    WorkdirError,
    check_params_fit,
    checkpoint_manager,
    error_line,
    path,
    read_config,
    restore_error,
    seal_step,
    step_dir,
    verify_step,
)


def _all_finite(tree: PyTree) -> bool:
    """Reduced on the devices: no host copy of the whole state, and valid for global arrays
    that span several processes (numpy cannot read those)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    finite = jax.jit(lambda xs: jnp.stack([jnp.isfinite(x).all() for x in xs]).all())(leaves)
    return bool(finite)


def save_state(
    manager: ocp.CheckpointManager,
    state: TrainState,
    data_state: Mapping[str, Any],
    seed: int,
    best: Mapping[str, Any] | None = None,
) -> None:
    """Saves global (not per-device) arrays; ``meta`` holds what resuming needs besides
    (``best``: the best-checkpoint tracker's state, see transformer/best.py)."""
    step = int(state.step)
    meta = {'step': step, 'data_state': dict(data_state), 'seed': seed, 'best': dict(best or {})}
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(state.opt_state),
            meta=ocp.args.JsonSave(meta),
        ),
    )


def restore_state(
    manager: ocp.CheckpointManager, step: int, abstract_state: TrainState, workdir: str
) -> tuple[TrainState, dict[str, Any]]:
    """The train state saved at ``step`` (into the layout of ``abstract_state``) and its meta;
    `Checkpoints.restore_latest` verifies the step first."""
    try:
        check_params_fit(workdir, step, abstract_state.params)
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_state.params),
                opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
                meta=ocp.args.JsonRestore(),
            ),
        )
    except RESTORE_ERRORS as e:
        raise WorkdirError(
            f'{restore_error(workdir, step, e, "this config (model or optimizer changed?)")}. '
            'Resume with the config the run was started with, or use a new --workdir.'
        ) from None
    state = TrainState(
        step=jnp.array(restored['meta']['step'], jnp.int32),
        params=restored['params'],
        opt_state=restored['opt_state'],
    )
    return state, restored['meta']


class Checkpoints:
    """The trainer's checkpoints: asynchronous saves that are sealed with a manifest once
    Orbax has finished them, and a resume that never starts from a step that failed checks.

    Disk errors while saving (a full disk, a read-only directory) become one-line
    `WorkdirError`s; the steps saved before stay as they were.
    """

    def __init__(self, workdir: str, config: ml_collections.ConfigDict):
        self.workdir = workdir
        self.config = config
        self.manager = checkpoint_manager(workdir, config)
        self._unsealed: list[int] = []  # saved by this process, manifest not yet written
        self._writes = jax.process_index() == 0

    def _save_error(self, step: int | None, error: BaseException) -> WorkdirError:
        first_line = error_line(error)
        kept = [s for s in self.manager.all_steps() if os.path.isdir(step_dir(self.workdir, s))]
        return WorkdirError(
            f'Could not write checkpoint step {step} in {self.workdir}/{CHECKPOINTS} '
            f'({first_line}); stopped. Steps saved before are intact: {sorted(kept)}.'
        )

    def save(
        self,
        state: TrainState,
        data_state: Mapping[str, Any],
        seed: int,
        best: Mapping[str, Any] | None = None,
    ) -> None:
        """Starts saving ``state`` (asynchronously if configured) after sealing the last."""
        self.seal()
        step = int(state.step)
        try:
            save_state(self.manager, state, data_state, seed, best)
        except OSError as e:
            raise self._save_error(step, e) from None
        self._unsealed.append(step)

    def seal(self) -> None:
        """Waits for the pending saves, then writes the manifests of the committed ones."""
        pending, self._unsealed = self._unsealed, []
        try:
            self.manager.wait_until_finished()
            # Orbax logs a failed background save and leaves the step uncommitted; this
            # re-raises its error (once per thread) so that the message can name the cause.
            self.manager.check_for_errors()
            for step in pending:
                # A save that failed in the background leaves no committed step directory.
                if not os.path.isdir(step_dir(self.workdir, step)):
                    raise OSError(errno.EIO, 'Orbax did not commit the step')
                if self._writes:
                    seal_step(self.workdir, step)
        except (OSError, ValueError, RuntimeError) as e:
            raise self._save_error(pending[-1] if pending else None, e) from None

    def finish(self) -> int | None:
        """For a run that stops early (an error, Ctrl-C): seals the saves in flight (their own
        failure is logged, not raised: the error that stopped the run is the one to report)
        and returns the newest step on disk (None: none)."""
        try:
            self.seal()
        except WorkdirError as e:
            logging.warning('%s', e)
        self.manager.reload()
        return self.manager.latest_step()

    def newest_verified(self) -> int | None:
        """The newest step whose files match its manifest (None: none)."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                if verify_step(self.workdir, step, warn=False):
                    return step
            except CorruptCheckpoint:
                continue
        return None

    def restore_latest(self, abstract_state: TrainState) -> tuple[TrainState, dict, int] | None:
        """(state, meta, step) of the newest intact step; None when there is no checkpoint.

        Newer steps that fail verification are moved to ``WORKDIR/corrupt_checkpoints/``
        (their step numbers will be saved again) with a one-line warning.
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        failed: list[CorruptCheckpoint] = []
        for step in steps:
            try:
                sealed = verify_step(self.workdir, step, warn=False)
                break
            except CorruptCheckpoint as e:
                failed.append(e)
        else:
            if not steps:
                return None
            raise WorkdirError(f'{failed[0]} No intact checkpoint to resume from: {steps}.')
        if failed:
            self._quarantine([int(s) for s in steps[: len(failed)]])
            logging.warning('%s Resuming from step %d, the newest intact one.', failed[0], step)
        state, meta = restore_state(self.manager, step, abstract_state, self.workdir)
        if not sealed:
            if not _all_finite((state.params, state.opt_state)):
                raise CorruptCheckpoint(
                    f'Checkpoint step {step} in {self.workdir}/{CHECKPOINTS} has no manifest '
                    'and holds non-finite values; move it away to resume from an earlier step.'
                )
            if self._writes:
                seal_step(self.workdir, step)
            logging.warning(
                'Checkpoint step %d had no %s (saved before checksums were kept, or the run '
                'stopped before sealing it); it restored completely with finite values, so '
                'it is now sealed.',
                *(step, MANIFEST),
            )
        self._warn_on_another_dropout_prng()
        return state, meta, step

    def _warn_on_another_dropout_prng(self) -> None:
        """Resuming draws other dropout masks than an uninterrupted run would: say so."""
        if os.path.exists(path(self.workdir, CONFIG_FILE)):
            saved_train = read_config(self.workdir).get('train', {})
            if warning := resumed_prng_warning(saved_train, self.config.train):
                logging.warning(warning)

    def _quarantine(self, steps: Sequence[int]) -> None:
        if self._writes:
            target = path(self.workdir, CORRUPT_CHECKPOINTS)
            os.makedirs(target, exist_ok=True)
            for step in steps:
                destination = tempfile.mkdtemp(prefix=f'{step}-', dir=target)
                shutil.move(step_dir(self.workdir, step), destination)
        self.manager.reload()
