"""Parameters read back from a run directory for evaluate, translate, visualize and export:
one step, the average of the last K, or the best one, each verified against its manifest
first. A step that cannot be read raises one line that names it and says what to do."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from transformer import data as data_lib
from transformer import schema
from transformer.checkpoint import arrays
from transformer.checkpoint.directory import (
    RESTORE_ERRORS,
    CheckpointRemoved,
    check_params_fit,
    checkpoint_manager,
    is_stacked,
    removed_error,
    restore_error,
    saved_params,
    verify_step,
)
from transformer.model import Transformer, config_from_dict, convert_layer_layout
from transformer.model import abstract_params as model_params
from transformer.rundir import BEST, CHECKPOINTS, WorkdirError, load_tokenizer, read_config

PyTree = Any

# Times `load_model` chooses its steps again when one is removed while being read.
_READ_ATTEMPTS = 3


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


def default_average(workdir: str, config: schema.Experiment) -> list[int]:
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


def abstract_params(model: Transformer, shardings: PyTree | None = None) -> PyTree:
    """Shapes and dtypes of the model's parameters in ``shardings`` (default: on this
    process's first device), without allocating them. The explicit sharding lets Orbax
    restore a checkpoint written by any number of devices or processes straight into it."""
    shapes = model_params(model)
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: device, shapes)
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
    )


def best_step(workdir: str) -> int:
    """The step of the best checkpoint (``WORKDIR/best``)."""
    step = checkpoint_manager(workdir, best=True).latest_step()
    if step is None:
        raise WorkdirError(f'No complete best checkpoint in {workdir}/{BEST}.')
    return step


def restore_params(
    workdir: str,
    step: int,
    model: Transformer,
    *,
    best: bool = False,
    shardings: PyTree | None = None,
) -> PyTree:
    """The parameters saved at ``step`` (``best``: in ``WORKDIR/best``), verified against the
    step's manifest (when it has one), checked against the model's shapes, in ``shardings``
    (default: on one local device) whatever the saving run's device count. Saved in the other
    layout of the layers (model.scan_layers), they are restored in it on one device and
    converted (one line says so)."""
    saved = saved_params(workdir, step, best=best)
    stacked = is_stacked(saved)
    if stacked is not None and stacked != model.config.scan_layers:
        other = Transformer(dataclasses.replace(model.config, scan_layers=stacked))
        params = restore_params(workdir, step, other, best=best)
        logging.info(
            'Step %d was saved with model.scan_layers=%s: its layers converted to %s.',
            step,
            stacked,
            'stacked' if model.config.scan_layers else 'one subtree each',
        )
        params = convert_layer_layout(params, model.config.scan_layers)
        return params if shardings is None else jax.device_put(params, shardings)
    target = abstract_params(model, shardings)
    try:
        verify_step(workdir, step, items=('params',), best=best)
        check_params_fit(saved, target)
        restored = arrays.restore(checkpoint_manager(workdir, best=best), step, {'params': target})
    except RESTORE_ERRORS as e:
        removed = removed_error(workdir, step, best)
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


def _mean(*xs: Any) -> Any:
    """The float64 mean of arrays, cast to float32; of sharded arrays shard by shard, each
    process averaging only the shards on its devices (nothing is gathered)."""
    if not isinstance(xs[0], jax.Array):
        return sum(np.asarray(x, np.float64) for x in xs) / len(xs)
    shards = []
    for group in zip(*(x.addressable_shards for x in xs), strict=True):
        mean = sum(np.asarray(s.data, np.float64) for s in group) / len(xs)
        shards.append(jax.device_put(mean.astype(np.float32), group[0].device))
    return jax.make_array_from_single_device_arrays(xs[0].shape, xs[0].sharding, shards)


def average_params(trees: Sequence[PyTree]) -> PyTree:
    """The element-wise mean of parameter trees (the paper averages checkpoints, Sec. 6.1),
    in float64 then float32; jax arrays keep their sharding."""
    if not trees:
        raise ValueError('No parameter trees to average.')
    return jax.tree.map(_mean, *trees)


def load_model(
    workdir: str,
    step: int | None = None,
    average_last: int | None = None,
    best: bool = False,
    *,
    shardings: Callable[[Transformer], PyTree] | None = None,
    tokenizer: data_lib.Tokenizer | None = None,
    scan_layers: bool | None = None,
) -> tuple[schema.Experiment, data_lib.Tokenizer, Transformer, PyTree, list[int]]:
    """Config, tokenizer, model and parameters of a training run.

    Args:
      workdir: the run's directory.
      step: load this checkpoint alone, or with ``average_last`` the last of those averaged.
      average_last: average the last K checkpoints (default without ``step``: the run's
        ``eval.average_last``, without the warm-up's and the first half's: `default_average`).
      best: load the best checkpoint by validation BLEU (``WORKDIR/best``) instead.
      shardings: the model -> its parameters' shardings (a decoding layout): each checkpoint
        is restored, and averaged, straight into them; default: this process's first device.
      tokenizer: the run's vocabulary when the caller has read it already (default: read).
      scan_layers: the layers' layout (model.scan_layers) instead of the run's (False: the
        per-layer tree the exports read); either layout's checkpoints load (`restore_params`).

    Returns:
      (config, tokenizer, model, params (float32), the steps loaded).
    """
    config = read_config(workdir)
    tokenizer = tokenizer or load_tokenizer(config, workdir)
    model_config = config_from_dict(config.model, tokenizer.vocab_size)
    if scan_layers is not None:
        model_config = dataclasses.replace(model_config, scan_layers=scan_layers)
    model = Transformer(model_config)
    placed = None if shardings is None else shardings(model)
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
            trees = [restore_params(workdir, s, model, best=best, shardings=placed) for s in steps]
            break
        except CheckpointRemoved as e:
            # A run training there saved a newer step and removed an old one: choose again,
            # unless the step was asked for by number or this keeps happening.
            if step is not None or attempt == _READ_ATTEMPTS - 1:
                raise
            logging.info('%s Choosing the steps again.', e)
    params = trees[0] if len(trees) == 1 else average_params(trees)
    params = jax.tree.map(
        lambda x: (
            x.astype(jnp.float32) if isinstance(x, jax.Array) else jnp.asarray(x, jnp.float32)
        ),
        params,
    )
    return config, tokenizer, model, params, steps
