"""Why a training run stops before its last step, and what it says then: each message names
the checkpoint the same command resumes from.

- `TrainingError`: the run cannot go on (processes that cannot join, a non-finite loss).
- `check_memory`: a compiled step that needs more memory than the process may still take
  stops the run before that step runs.
- `check_finite`: a non-finite loss or gradient stops the run at the step that shows it.
- `interrupted`: what Ctrl-C leaves, as the `Interrupted` the train command prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer import multihost, rundir, schema
from transformer.checkpoint import Checkpoints
from transformer.training import footprint


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message says why and what was kept."""


class Interrupted(TrainingError):
    """Ctrl-C stopped the loop; the message names the checkpoint to resume from."""


def check_finite(
    checkpoints: Checkpoints,
    step: int,
    sums: Mapping[str, Any],
    *,
    restored_step: int | None,
    log_every: int,
) -> None:
    """Stops on a non-finite loss or gradient, naming the newest checkpoint that verifies;
    right after a resume (within ``log_every`` steps of ``restored_step``) it says that this
    checkpoint itself may be the cause."""
    if np.isfinite(sums['loss']) and np.isfinite(sums['grad_norm']):
        return
    checkpoints.seal()
    good = checkpoints.newest_verified()
    where = f'{checkpoints.workdir}/{rundir.CHECKPOINTS}'
    kept = f'step {good} in {where}' if good is not None else f'none in {where}'
    message = (
        f'Non-finite loss or gradient at step {step} (loss={sums["loss"]}, '
        f'grad_norm={sums["grad_norm"]}); stopped. Newest verified checkpoint: {kept}. '
    )
    since = None if restored_step is None else step - restored_step
    if since is not None and since <= log_every:
        message += (
            f'The run resumed from step {restored_step} only {since} step(s) before, so '
            'that checkpoint itself may be bad (its values, not only the learning rate): move '
            f'checkpoints/{restored_step} away to resume from an earlier step, or lower '
            'opt.lr_scale / raise opt.warmup_steps.'
        )
    else:
        message += 'Lower opt.lr_scale or raise opt.warmup_steps.'
    raise TrainingError(message)


def check_memory(experiment: schema.Experiment, compiled: Any, devices: Sequence[Any]) -> None:
    """Stops before the first step when XLA's memory analysis of the ``compiled`` step says
    it needs more than the process may still take on ``devices`` (`footprint.step_refusal`):
    on a CPU the kernel would otherwise grant the memory and kill the process, without a
    message, once the step touches it. Every process of a multi-host run decides alike (one
    that would not fit stops them all, not only itself while the others wait at step 1)."""
    why = footprint.step_refusal(experiment, compiled, devices)
    if multihost.all_ok(why is None):
        return
    if why is None:
        why = "Another process's compiled training step does not fit its memory (its log says)."
    else:
        why, detail = why.split('\n', 1)
        logging.error('%s', detail)  # the figures and every remedy, before the one-line error
    raise TrainingError(f'{why} No step ran; checkpoints already saved are untouched.')


def interrupted(workdir: str, step: int, newest: int | None) -> Interrupted:
    """What Ctrl-C at ``step`` leaves: the step the same command resumes from, or none."""
    where = f'{workdir}/{rundir.CHECKPOINTS}'
    if newest is None:
        return Interrupted(
            f'Interrupted at step {step}, before any checkpoint in {where}: the same command '
            'starts this run over from step 0.'
        )
    return Interrupted(
        f'Interrupted at step {step}; the same command resumes from step {newest} in {where}.'
    )
