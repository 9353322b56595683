"""A training run's checkpoints, as the trainer uses them: saves (asynchronous if configured)
sealed with a manifest as soon as Orbax commits them, the best checkpoint, and a resume that
never starts from a step that failed its checks (transformer/checkpoint/resume.py;
transformer/checkpoint/__init__.py, "Integrity", says why and how)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping
from typing import Any

import orbax.checkpoint as ocp
from absl import logging

from transformer import multihost, schema
from transformer.checkpoint import arrays, resume
from transformer.checkpoint.directory import (
    CorruptCheckpoint,
    checkpoint_manager,
    seal_step,
    verify_step,
)
from transformer.checkpoint.resume import State, TrainState
from transformer.rundir import CHECKPOINTS, WorkdirError, error_line, step_dir

PyTree = Any


class Checkpoints:
    """The checkpoints of a training run in ``workdir``: ``WORKDIR/checkpoints`` (the last
    ``train.keep_checkpoints`` steps) and, with validation BLEU (``eval.bleu_every``),
    ``WORKDIR/best``.

    Disk errors while saving (a full disk, a read-only directory) become one-line
    `WorkdirError`s; the steps saved before stay as they were. In a multi-host run every
    process calls each method (saves and restores are collective); process 0 writes the
    manifests and chooses the step to resume from, the others follow.
    """

    def __init__(self, workdir: str, config: schema.Experiment):
        self.workdir = workdir
        self._manager = checkpoint_manager(workdir, config)
        self._config = config
        self._best: ocp.CheckpointManager | None = None
        self._writes = multihost.is_main()
        # Steps saved by this process whose manifest seal() has not confirmed yet, with the
        # thread that seals each once Orbax has committed it.
        self._sealers: dict[int, threading.Thread] = {}
        self._sealed: set[int] = set()
        self._seal_lock = threading.Lock()

    def restore_latest(self, abstract_state: State) -> tuple[State, dict, int] | None:
        """(state, meta, step) of the newest intact step, restored into the layout of
        ``abstract_state`` (whatever the layout that saved it); None when there is no
        checkpoint. `resume.restore_latest` says which step that is and what happens to the
        steps that fail their checks. Then ``WORKDIR/best`` is opened (a resume that fails
        leaves it as it was)."""
        resumed = resume.restore_latest(self._manager, self.workdir, abstract_state, self._writes)
        if self._config.eval.bleu_every:
            self._best_manager()
        return resumed

    def _save_error(self, step: int | None, error: BaseException) -> WorkdirError:
        first_line = error_line(error)
        kept = [s for s in self._manager.all_steps() if os.path.isdir(step_dir(self.workdir, s))]
        return WorkdirError(
            f'Could not write checkpoint step {step} in {self.workdir}/{CHECKPOINTS} '
            f'({first_line}); stopped. Steps saved before are intact: {sorted(kept)}.'
        )

    def save(self, state: TrainState, meta: Mapping[str, Any]) -> None:
        """Starts saving ``state`` (global, not per-device, arrays; asynchronously if
        configured) with ``meta`` (JSON: what resuming needs besides, to which the step is
        added); the step is sealed in the background as soon as Orbax commits it. A failure of
        the previous save raises here."""
        self.seal()
        step = int(state.step)
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    params=arrays.save_args(state.params),
                    opt_state=arrays.save_args(state.opt_state),
                    meta=ocp.args.JsonSave({'step': step, **meta}),
                ),
            )
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
            self._manager.wait_until_finished()
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
            self._manager.wait_until_finished()
            # Orbax logs a failed background save and leaves the step uncommitted; this
            # re-raises its error (once per thread) so that the message can name the cause.
            self._manager.check_for_errors()
            for step, sealer in pending.items():
                sealer.join()
                # A save that failed in the background leaves no committed step directory.
                if not os.path.isdir(step_dir(self.workdir, step)):
                    raise OSError(errno.EIO, 'Orbax did not commit the step')
                self._seal_once(step)  # (a no-op unless the sealing thread failed)
        except (OSError, ValueError, RuntimeError) as e:
            raise self._save_error(max(pending) if pending else None, e) from None
        if self._best is not None:
            self._best.wait_until_finished()

    def finish(self) -> int | None:
        """For a run that stops early (an error, Ctrl-C): seals the saves in flight (their own
        failure is logged, not raised: the error that stopped the run is the one to report)
        and returns the newest step on disk (None: none)."""
        try:
            self.seal()
        except WorkdirError as e:
            logging.warning('%s', e)
        self._manager.reload()
        return self._manager.latest_step()

    def newest_verified(self) -> int | None:
        """The newest step whose files match its manifest (None: none)."""
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                if verify_step(self.workdir, step, warn=False):
                    return step
            except CorruptCheckpoint:
                continue
        return None

    def _best_manager(self) -> ocp.CheckpointManager:
        if self._best is None:
            self._best = checkpoint_manager(self.workdir, self._config, best=True)
        return self._best

    def save_best(self, params: PyTree, meta: Mapping[str, Any]) -> None:
        """Replaces ``WORKDIR/best`` with ``params`` (global arrays) and ``meta`` (JSON with
        the ``step``), sealed with a manifest like every other step."""
        manager = self._best_manager()
        step = int(meta['step'])
        for old in manager.all_steps():
            if old >= step:  # written by a run that stopped before its next regular checkpoint
                manager.delete(old)
        manager.save(
            step,
            args=ocp.args.Composite(
                params=arrays.save_args(params), meta=ocp.args.JsonSave(dict(meta))
            ),
        )
        manager.wait_until_finished()  # rare (an improved BLEU): sealing it at once is cheap
        if self._writes:
            seal_step(self.workdir, step, best=True)


def save_params(workdir: str, config: schema.Experiment, step: int, params: PyTree, meta: Any):
    """Writes ``WORKDIR/checkpoints/<step>`` holding parameters and ``meta`` alone (no
    optimizer state: a converted model), sealed with its manifest like a training step."""
    manager = checkpoint_manager(workdir, config)
    manager.save(
        step,
        args=ocp.args.Composite(
            params=arrays.save_args(params),
            meta=ocp.args.JsonSave({'step': step, **meta}),
        ),
    )
    manager.wait_until_finished()
    manager.close()
    seal_step(workdir, step)
