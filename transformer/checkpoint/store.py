"""Checkpoints on disk: Orbax managers, the manifests that seal each step, and parameters
loaded back (one step or the average of the last K) for evaluate, translate, visualize and
export. Any checkpoint that cannot be read raises `WorkdirError` with one line that names the
step and what to do. Paths inside the run directory come from transformer/rundir.py.

Integrity. Orbax commits a step atomically (written under a temporary name, then renamed)
but does not checksum the data, so a flipped or truncated file loads silently. Every step
therefore gets ``checkpoints/<step>/manifest.json``: the size and sha256 of each of its
files, written (atomically, by rename) by a thread that waits for Orbax to commit the step
(`Checkpoints.save`), so that no later change to the files can be certified. Every restore
verifies the manifest first; a file that is missing, of another size or another hash
raises `CorruptCheckpoint` naming the step and the file. Training resume falls back to the
newest intact step (moving the corrupt ones to ``corrupt_checkpoints/``, as their step
numbers will be written again) and stops when none is intact.

A step without a manifest is either older than this scheme or was committed by a run
killed in the moment between the commit and its manifest. It is accepted with a one-line
warning rather than refused (refusing would strand every existing run), and never sealed
afterwards: hashing bytes nobody saw written would certify whatever is there. When
training cannot restore such a step it falls back to an older one, as for a corrupt step,
provided the older one restores with the same config (else the config, not the files, is
at fault, and the run stops without moving anything). The other commands never write
manifests: they only read the run directory. Saves killed half-way leave Orbax temporary
directories, which the next training run removes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from flax import linen as nn

from transformer import data as data_lib
from transformer.checkpoint import checksums
from transformer.model import Transformer, config_from_dict
from transformer.rundir import (
    BEST,
    CHECKPOINTS,
    MANIFEST,
    WorkdirError,
    error_line,
    load_tokenizer,
    path,
    read_config,
    step_dir,
    wrong_kind,
)

PyTree = Any


_ITEMS = ('params', 'opt_state', 'meta')
# Times `load_model` chooses its steps again when one is removed while being read.
_READ_ATTEMPTS = 3


# What Orbax raises for a checkpoint that is missing pieces or does not fit the target tree
# (ValueError, KeyError, TypeError, FileNotFoundError), and for a file TensorStore cannot read
# (a plain Exception): every one becomes a one-line error naming the step.
RESTORE_ERRORS = (Exception,)


class CorruptCheckpoint(WorkdirError):
    """A checkpoint step whose files differ from its manifest."""


class CheckpointRemoved(WorkdirError):
    """A checkpoint step deleted while it was read (a training run keeps only its last K)."""


def _removed(workdir: str, step: int, best: bool) -> CheckpointRemoved | None:
    """The error to raise instead of a read's when the step's directory is gone."""
    if os.path.isdir(step_dir(workdir, step, best=best)):
        return None
    where = BEST if best else CHECKPOINTS
    return CheckpointRemoved(
        f'Checkpoint step {step} in {workdir}/{where} was removed while being read (a run '
        'still training there keeps only its last train.keep_checkpoints steps).'
    )


def checkpoint_manager(
    workdir: str, config: ml_collections.ConfigDict | None = None, *, best: bool = False
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
    return ocp.CheckpointManager(directory, options=options, item_names=_ITEMS)


def save_best(
    manager: ocp.CheckpointManager, params: PyTree, meta: Mapping[str, Any], workdir: str
) -> None:
    """Replaces the best checkpoint (``manager`` of ``WORKDIR/best``) with ``params``, sealed
    with a manifest like every other step."""
    step = int(meta['step'])
    for old in manager.all_steps():
        if old >= step:  # written by a run that stopped before its next regular checkpoint
            manager.delete(old)
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(dict(meta))
        ),
    )
    manager.wait_until_finished()  # rare (an improved BLEU): sealing it at once is cheap
    if jax.process_index() == 0:
        seal_step(workdir, step, best=True)


def restore_error(workdir: str, step: int, error: Exception, what: str) -> WorkdirError:
    first_line = error_line(error)
    return WorkdirError(
        f'The checkpoint at step {step} in {workdir}/{CHECKPOINTS} does not fit {what} or is '
        f'incomplete: {first_line}'
    )


def check_params_fit(workdir: str, step: int, params: PyTree, *, best: bool = False) -> None:
    """ValueError naming the first parameter whose saved shape differs from abstract ``params``,
    before any array is read (a restore failing half-way left tensorstore reads in flight,
    which printed tracebacks after the error line)."""
    item = epath.Path(step_dir(workdir, step, best=best)) / 'params'
    try:
        saved = ocp.StandardCheckpointHandler().metadata(item)
    except Exception:  # noqa: BLE001 - no readable metadata: the restore says what is wrong
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


def _leaves(tree: PyTree) -> list:
    return jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, 'shape'))


def seal_step(workdir: str, step: int, *, best: bool = False) -> None:
    """Writes the manifest of a finished step: size and sha256 of each of its files."""
    checksums.write(step_dir(workdir, step, best=best), MANIFEST)


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

    Returns:
      True when verified, False when the step has no manifest (accepted unverified; see the
      module docstring).

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


def checkpoint_steps(
    workdir: str, step: int | None = None, average_last: int = 1, *, warn: bool = True
) -> list[int]:
    """The steps to load: the last ``average_last`` saved ones, ending at ``step`` if given.

    ``step`` alone (``average_last`` 1) is that checkpoint; with ``average_last`` K it is the
    last of the K averaged, so an earlier point of a run can be scored as a shorter run's
    average would be (the checkpoints saved up to it are the same).
    """
    steps = sorted(checkpoint_manager(workdir).all_steps())
    if not steps:
        raise WorkdirError(f'No complete checkpoint in {workdir}/{CHECKPOINTS}.')
    if step is not None:
        if step not in steps:
            raise WorkdirError(f'No checkpoint for step {step} in {workdir}; saved: {steps}.')
        steps = steps[: steps.index(step) + 1]
    if average_last > len(steps) and warn:
        logging.warning(
            'Asked to average the last %d checkpoints but only %d exist%s; averaging those.',
            average_last,
            len(steps),
            '' if step is None else f' up to step {step}',
        )
    return steps[-average_last:]


def default_average(workdir: str, config: ml_collections.ConfigDict) -> list[int]:
    """The steps a command averages when told none: of the last ``eval.average_last`` saved
    steps, those after the warm-up (``opt.warmup_steps``) and in the second half of the
    training so far (step >= newest / 2); the newest step always. Parameters from the
    warm-up or from far earlier pull the average away from where training arrived."""
    wanted = config.eval.average_last
    last = checkpoint_steps(workdir, average_last=wanted, warn=False)  # said once, below
    newest, warmup = last[-1], config.opt.warmup_steps
    steps = [s for s in last if s > warmup and 2 * s >= newest] or [newest]
    if steps != last or len(last) < wanted:
        saved = f'the last {len(last)} saved' if len(last) == wanted else f'the {len(last)} saved'
        left_out = (
            ''
            if steps == last
            else f'; the others are in the warm-up (opt.warmup_steps={warmup}) or the first '
            f'half of training (--average_last {len(last)} takes them all)'
        )
        logging.info(
            'Averaging steps %s of %s %s (eval.average_last=%d)%s.',
            *(steps, saved, last, wanted, left_out),
        )
    return steps


def abstract_params(model: Transformer) -> PyTree:
    """Shapes and dtypes of the model's parameters on this process's first device, without
    allocating them. The explicit sharding lets Orbax restore a checkpoint written by any
    number of devices or processes."""
    dummy = jnp.ones((1, 8), jnp.int32)
    shapes = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy)['params']))
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)


def best_step(workdir: str) -> int:
    """The step of the best checkpoint (``WORKDIR/best``)."""
    step = checkpoint_manager(workdir, best=True).latest_step()
    if step is None:
        raise WorkdirError(f'No complete best checkpoint in {workdir}/{BEST}.')
    return step


def restore_params(workdir: str, step: int, model: Transformer, *, best: bool = False) -> PyTree:
    """The parameters saved at ``step`` (``best``: in ``WORKDIR/best``), verified against the
    step's manifest (when it has one), checked against the model's shapes, on one local
    device whatever the saving run's device count."""
    target = abstract_params(model)
    try:
        verify_step(workdir, step, items=('params',), best=best)
        check_params_fit(workdir, step, target, best=best)
        restored = checkpoint_manager(workdir, best=best).restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target))
        )
    except RESTORE_ERRORS as e:
        removed = _removed(workdir, step, best)
        if removed is not None:
            raise removed from None
        if isinstance(e, WorkdirError):
            raise
        raise restore_error(workdir, step, e, 'the model of its config.json') from None
    params = restored['params']
    if jax.tree.map(np.shape, params) != jax.tree.map(lambda x: x.shape, target):
        raise WorkdirError(
            f'The checkpoint at step {step} in {workdir}/{CHECKPOINTS} has parameter shapes '
            'that differ from the model in config.json.'
        )
    return params


def average_params(trees: Sequence[PyTree]) -> PyTree:
    """The element-wise mean of parameter trees (the paper averages checkpoints, Sec. 6.1)."""
    if not trees:
        raise ValueError('No parameter trees to average.')
    return jax.tree.map(lambda *xs: sum(np.asarray(x, np.float64) for x in xs) / len(xs), *trees)


def load_model(
    workdir: str, step: int | None = None, average_last: int | None = None, best: bool = False
) -> tuple[ml_collections.ConfigDict, data_lib.Tokenizer, Transformer, PyTree, list[int]]:
    """Config, tokenizer, model and parameters of a training run.

    Args:
      workdir: the run's directory.
      step: load this checkpoint alone, or with ``average_last`` the last of those averaged.
      average_last: average the last K checkpoints (default without ``step``: the run's
        ``eval.average_last``, without the warm-up's and the first half's: `default_average`).
      best: load the best checkpoint by validation BLEU (``WORKDIR/best``) instead.

    Returns:
      (config, tokenizer, model, params, the steps loaded).
    """
    config = read_config(workdir)
    tokenizer = load_tokenizer(config, workdir)
    model = Transformer(config_from_dict(config.model, tokenizer.vocab_size))
    if best and (step is not None or average_last is not None):
        raise WorkdirError('Load the best checkpoint or a step / an average, not both.')
    for attempt in range(_READ_ATTEMPTS):
        if best:
            steps = [best_step(workdir)]
        elif step is None and average_last is None:
            steps = default_average(workdir, config)
        else:
            steps = checkpoint_steps(workdir, step, average_last or 1)
        try:
            trees = [restore_params(workdir, s, model, best=best) for s in steps]
            break
        except CheckpointRemoved as e:
            # A run training there saved a newer step and removed an old one: choose again,
            # unless the step was asked for by number or this keeps happening.
            if step is not None or attempt == _READ_ATTEMPTS - 1:
                raise
            logging.info('%s Choosing the steps again.', e)
    params = trees[0] if len(trees) == 1 else average_params(trees)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    return config, tokenizer, model, params, steps
