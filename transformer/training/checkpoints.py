"""The trainer's checkpoints: saves sealed with a manifest when they commit, resumes that
never start from a step that failed its checks (transformer/checkpoint/store.py,
"Integrity", says why and how)."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging

from transformer import multihost, schema
from transformer.checkpoint.directory import (
    RESTORE_ERRORS,
    CorruptCheckpoint,
    check_params_fit,
    checkpoint_manager,
    restore_error,
    seal_step,
    verify_step,
)
from transformer.rundir import (
    CHECKPOINTS,
    CONFIG_FILE,
    CORRUPT_CHECKPOINTS,
    MANIFEST,
    WorkdirError,
    error_line,
    path,
    read_config,
    step_dir,
)
from transformer.training.steps import TrainState, resumed_prng_warning


class RestoreFailed(WorkdirError):
    """A step that could not be restored into the train state; ``reason``: the first line of
    what Orbax raised."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def save_state(
    manager: ocp.CheckpointManager,
    state: TrainState,
    data_state: Mapping[str, Any],
    seed: int,
    best: Mapping[str, Any] | None = None,
) -> None:
    """Saves global (not per-device) arrays; ``meta`` holds what resuming needs besides
    (``best``: the best-checkpoint tracker's state, see transformer/training/best.py)."""
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
        raise RestoreFailed(
            f'{restore_error(workdir, step, e, "this config (model or optimizer changed?)")}. '
            'Resume with the config the run was started with, or use a new --workdir.',
            reason=error_line(e),
        ) from None
    state = TrainState(
        step=jnp.array(restored['meta']['step'], jnp.int32),
        params=restored['params'],
        opt_state=restored['opt_state'],
    )
    return state, restored['meta']


class Checkpoints:
    """The trainer's checkpoints: asynchronous saves, each sealed with a manifest as soon as
    Orbax has committed it, and a resume that never starts from a step that failed checks.

    Disk errors while saving (a full disk, a read-only directory) become one-line
    `WorkdirError`s; the steps saved before stay as they were. In a multi-host run process 0
    writes the manifests and chooses the step to resume from; the others follow.
    """

    def __init__(self, workdir: str, config: schema.Experiment):
        self.workdir = workdir
        self.config = config
        self.manager = checkpoint_manager(workdir, config)
        self._writes = multihost.is_main()
        # Steps saved by this process whose manifest seal() has not confirmed yet, with the
        # thread that seals each once Orbax has committed it.
        self._sealers: dict[int, threading.Thread] = {}
        self._sealed: set[int] = set()
        self._seal_lock = threading.Lock()

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
        """Starts saving ``state`` (asynchronously if configured); the step is sealed in the
        background as soon as Orbax commits it. A failure of the previous save raises here."""
        self.seal()
        step = int(state.step)
        try:
            save_state(self.manager, state, data_state, seed, best)
        except OSError as e:
            raise self._save_error(step, e) from None
        sealer = threading.Thread(
            target=self._seal_when_committed, args=(step,), name=f'seal-{step}', daemon=True
        )
        self._sealers[step] = sealer
        sealer.start()

    def _seal_when_committed(self, step: int) -> None:
        """The sealing thread: the manifest is written right after the commit, so that no
        later change of the files can be certified. Errors are left to `seal`."""
        try:
            self.manager.wait_until_finished()
            if os.path.isdir(step_dir(self.workdir, step)):
                self._seal_once(step)
        except Exception:  # noqa: BLE001, S110 - seal() raises it with the step's message
            pass

    def _seal_once(self, step: int) -> None:
        with self._seal_lock:
            if step not in self._sealed:
                if self._writes:
                    seal_step(self.workdir, step)
                self._sealed.add(step)

    def seal(self) -> None:
        """Waits for the pending saves and their manifests; raises a save that failed."""
        pending, self._sealers = self._sealers, {}
        try:
            self.manager.wait_until_finished()
            # Orbax logs a failed background save and leaves the step uncommitted; this
            # re-raises its error (once per thread) so that the message can name the cause.
            self.manager.check_for_errors()
            for step, sealer in pending.items():
                sealer.join()
                # A save that failed in the background leaves no committed step directory.
                if not os.path.isdir(step_dir(self.workdir, step)):
                    raise OSError(errno.EIO, 'Orbax did not commit the step')
                self._seal_once(step)  # (a no-op unless the sealing thread failed)
        except (OSError, ValueError, RuntimeError) as e:
            raise self._save_error(max(pending) if pending else None, e) from None

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

        Process 0 chooses the step: the newest whose files match its manifest; newer steps
        that do not are moved to ``WORKDIR/corrupt_checkpoints/`` (their step numbers will
        be saved again) with a one-line warning. Every process then restores it. A step
        without manifest that cannot be restored is moved there too, once an older step
        has restored with this config (so that its files, not the config, are at fault); a
        config that fits no step stops the run and moves nothing.
        """
        unreadable: list[tuple[int, RestoreFailed]] = []
        below = None
        while True:
            step = multihost.on_main(
                functools.partial(self._newest_intact, below), 'verify the checkpoints'
            )
            self.manager.reload()  # process 0 may have moved steps away (on_main waited)
            if step is None:
                if unreadable:
                    raise unreadable[0][1]
                return None
            sealed = os.path.exists(os.path.join(step_dir(self.workdir, step), MANIFEST))
            error = None
            try:
                state, meta = restore_state(self.manager, step, abstract_state, self.workdir)
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
            self._quarantine([s for s, _ in unreadable])
            multihost.barrier('checkpoints-quarantined')
            self.manager.reload()
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
        self._warn_on_another_dropout_prng()
        return state, meta, step

    def _newest_intact(self, below: int | None) -> int | None:
        """Process 0: the newest step (below ``below``) that matches its manifest or has
        none; newer ones that fail verification are quarantined."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        steps = [s for s in steps if below is None or s < below]
        failed: list[CorruptCheckpoint] = []
        for step in steps:
            try:
                verify_step(self.workdir, step, warn=False)
                break
            except CorruptCheckpoint as e:
                failed.append(e)
        else:
            if not steps:
                return None
            raise WorkdirError(f'{failed[0]} No intact checkpoint to resume from: {steps}.')
        if failed:
            self._quarantine(steps[: len(failed)])
            logging.warning('%s Resuming from step %d, the newest intact one.', failed[0], step)
        return step

    def _warn_on_another_dropout_prng(self) -> None:
        """Resuming draws other dropout masks than an uninterrupted run would: say so."""
        if os.path.exists(path(self.workdir, CONFIG_FILE)):
            saved_train = read_config(self.workdir).train
            if warning := resumed_prng_warning(saved_train, self.config.train):
                logging.warning(warning)

    def _quarantine(self, steps: Sequence[int]) -> None:
        """Moves ``steps`` to ``WORKDIR/corrupt_checkpoints/`` (process 0; every process then
        reloads its step list once all have reached this point)."""
        if self._writes:
            target = path(self.workdir, CORRUPT_CHECKPOINTS)
            os.makedirs(target, exist_ok=True)
            for step in steps:
                destination = tempfile.mkdtemp(prefix=f'{step}-', dir=target)
                shutil.move(step_dir(self.workdir, step), destination)
