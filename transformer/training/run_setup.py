"""A training run built in its work directory, or resumed there: the config checked once, the
processes joined (jax.distributed), the work directory locked, then the vocabulary, model,
optimizer, `Parallel`, train state (restored from the newest checkpoint that passes its checks),
data iterator at its saved position and the best-checkpoint tracker: a `Run`, which
transformer/training/loop.py trains."""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from absl import logging

from transformer import data as data_lib
from transformer import lock as lock_lib
from transformer import multihost, run_changes, rundir, schema
from transformer.checkpoint import Checkpoints
from transformer.model import Transformer, describe
from transformer.training import (
    config_checks,
    footprint,
    init_from,
    optim,
    steps,
    stops,
    workdir_checks,
)
from transformer.training.best import BestTracker
from transformer.training.parallel import Parallel
from transformer.training.steps import TrainState
from transformer.training.stops import TrainingError


@dataclasses.dataclass
class Run:
    """Everything `setup` builds for a training run."""

    config: schema.Experiment  # typed, checked
    workdir: str
    tokenizer: data_lib.Tokenizer
    model: Transformer
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    parallel: Parallel
    state: TrainState  # in the parallel mode's device layout
    train_iter: data_lib.TrainIterator
    checkpoints: Checkpoints  # WORKDIR/checkpoints and, with validation BLEU, WORKDIR/best
    best: BestTracker
    dropout_rng: jax.Array
    num_params: int
    restored_step: int | None  # the checkpoint this run resumed from
    lock: Any = None  # WORKDIR/train.lock while this process trains (transformer/lock.py)

    @property
    def is_main(self) -> bool:
        return jax.process_index() == 0


def init_distributed(tc: Any, keys: str = 'train.') -> None:
    """Joins the processes of a multi-host run (``train.distributed``), before jax is used.

    ``train.coordinator_address`` / ``num_processes`` / ``process_id`` go to
    ``jax.distributed.initialize``; unset, the cluster (SLURM, TPU pods, ...) is detected.
    A process that cannot reach the coordinator stops after ``train.init_timeout_s``.
    ``keys``: how the errors name those settings (``'--'``: the decoding commands' flags).
    """
    if not tc.distributed:
        return
    kwargs = {
        key: getattr(tc, key)
        for key in ('coordinator_address', 'num_processes', 'process_id')
        if getattr(tc, key) is not None
    }
    count, index = kwargs.get('num_processes'), kwargs.get('process_id')
    if count is not None and index is not None and index >= count:
        raise TrainingError(
            f'{keys}process_id={index} is not one of the {count} processes of '
            f'{keys}num_processes (0 .. {count - 1}).'
        )
    address = kwargs.get('coordinator_address')
    if address and kwargs.get('process_id', 0) != 0:
        # jax aborts the process (after its own timeout, with a page of C++ stack) when the
        # coordinator never answers; a plain TCP probe first turns that into one line.
        _wait_for_coordinator(address, tc.init_timeout_s, keys)
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=int(tc.init_timeout_s))
    except Exception as e:  # noqa: BLE001 - jax raises several types here; all mean the same
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise TrainingError(
            f'Could not join the run of {kwargs.get("num_processes", "?")} processes at '
            f'{kwargs.get("coordinator_address", "the auto-detected coordinator")} within '
            f'{tc.init_timeout_s} s ({keys}init_timeout_s): {first_line}'
        ) from None
    if jax.process_index() != 0:
        logging.set_verbosity(logging.WARNING)  # only process 0 logs progress


def _wait_for_coordinator(address: str, timeout_s: float, keys: str) -> None:
    host, _, port = address.rpartition(':')
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise TrainingError(
                    f'No coordinator answers at {address} ({keys}coordinator_address) after '
                    f'{timeout_s} s ({keys}init_timeout_s): {e.strerror or e}. Start process 0 '
                    'first, or check the address and port.'
                ) from None
            time.sleep(0.2)


def setup(
    config: schema.Config, workdir: str, *, devices=None, overridden: Sequence[str] = ()
) -> Run:
    """Builds a run in ``workdir``, restored from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval): from a config
        file, parsed here once into its typed sections (transformer/schema/), or typed.
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the devices to use (default: all devices of all processes).
      overridden: the config keys set on the command line; with ``train.init_from`` one
        that changes the model it gives stops the run (transformer/training/init_from.py).

    From here on this process holds ``WORKDIR/train.lock`` (`transformer.lock`): a second
    training run in the same workdir stops in one line. ``lock.release(run.lock)`` gives it
    back (`train_and_evaluate` does when it returns).
    """
    if not isinstance(config, schema.Experiment):
        config = schema.parse(schema.complete(config))  # a file written before a field existed
    init_distributed(config.train)
    # Before anything is written: the workdir, the start, the vocabulary, a resume's changes;
    # now that the processes have joined, the batch against the devices of all of them.
    checked = workdir_checks.before_writing(config, workdir, overridden)
    config = config_checks.check(checked.config, jax.devices() if devices is None else devices)
    created = rundir.create(workdir)  # or one line on a path of the wrong kind
    lock = lock_lib.acquire(workdir)
    try:
        return _setup(config, workdir, devices, lock, checked)
    except BaseException:
        lock_lib.release(lock)
        if created and lock is not None:
            lock_lib.remove_unused(workdir)  # a bad data path leaves no empty run directory
        raise


def _setup(
    config: schema.Experiment, workdir: str, devices, lock, checked: workdir_checks.Checked
) -> Run:
    tc, start, changes = config.train, checked.start, checked.changes
    tokenizer = _build_data(config, workdir, start)
    model = steps.build_model(config, tokenizer.vocab_size)
    tx, schedule = optim.make_optimizer(config.opt, config.model.d_model, tc.num_steps)
    parallel = Parallel.from_config(config, model, tx, schedule, devices)
    footprint.check(config, parallel.devices, tokenizer.vocab_size)  # the logits, now known
    parallel.check_compiled = functools.partial(stops.check_memory, config)  # before step 1
    init_rng = jax.random.split(jax.random.key(tc.seed))[0]
    dropout_rng = steps.dropout_key(tc.seed, tc.dropout_prng)
    init = functools.partial(steps.init_state, model, tx, init_rng, config.data.max_len)
    train_iter = data_lib.make_train_iterator(
        config.data,
        tokenizer,
        batch_size=tc.batch_size,
        seed=tc.seed,
        cache_dir=rundir.data_cache_dir(config, workdir),
        data_group=parallel.data_group,
        data_groups=parallel.data_groups,
        build=multihost.is_main(),
    )
    checkpoints = Checkpoints(workdir, config)
    # Restored straight into this run's global layout, whatever the layout that saved it.
    restored = checkpoints.restore_latest(parallel.abstract_state(init))
    state, meta, latest = restored or (init_from.init_state(start, parallel, init, tx), None, None)
    if latest is not None:
        train_iter.set_state(meta['data_state'])
        logging.info('Resumed from %s at step %d.', workdir, latest)
        if warning := steps.resumed_prng_warning(changes):
            logging.warning(warning)
    best = BestTracker.from_config(config, _best_record(workdir, meta, latest))  # reads, checks
    run_changes.keep_record(workdir, config, latest, changes)  # the first write of a resume
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    cfg = model.config
    logging.info(
        'Model: %s parameters (d_model %d, %d heads, %d+%d layers, d_ff %d, %s; %s); %s mode '
        'over %d devices of %d processes.',
        *(f'{num_params:,}', cfg.d_model, cfg.num_heads, cfg.num_encoder_layers),
        *(cfg.num_decoder_layers, cfg.d_ff, describe(cfg), jnp.dtype(cfg.dtype).name),
        tc.parallelism,
        *(len(parallel.devices), jax.process_count()),
    )
    return Run(
        config=config,
        workdir=workdir,
        tokenizer=tokenizer,
        model=model,
        tx=tx,
        schedule=schedule,
        parallel=parallel,
        state=parallel.put_state(state),
        train_iter=train_iter,
        checkpoints=checkpoints,
        best=best,
        dropout_rng=dropout_rng,
        num_params=num_params,
        restored_step=latest,
        lock=lock,
    )


def prepare_data(
    config: schema.Config, workdir: str, overridden: Sequence[str] = ()
) -> tuple[data_lib.Tokenizer, list[str]]:
    """What a training run's set-up builds before its first step, and nothing more: the
    vocabulary and the training split's token store (one per corpus of ``data.mix``;
    transformer-prepare), and config.json where the run has no checkpoint yet. Returns the
    vocabulary and the stores' paths. Single-process; holds the workdir's lock meanwhile.

    Args:
      config: the experiment config, as `setup` takes it.
      workdir: the run directory (made where missing; a converted model's is refused).
      overridden: the config keys set on the command line (`setup`'s).
    """
    if not isinstance(config, schema.Experiment):
        config = schema.parse(schema.complete(config))
    checked = workdir_checks.before_writing(config, workdir, overridden)
    config, start = checked.config, checked.start
    data_lib.sources.check_dataset(config.data)
    data_lib.sources.check_files(config.data, [config.data.train_split])
    data_lib.check_mix_files(config.data)
    created = rundir.create(workdir)
    lock = lock_lib.acquire(workdir)
    try:
        tokenizer = _build_data(config, workdir, start)
        if not rundir.has_checkpoints(workdir):  # what its vocabulary was made with
            run_changes.keep_record(workdir, config, None, [])
    except BaseException:
        lock_lib.release(lock)
        if created and lock is not None:
            lock_lib.remove_unused(workdir)
        raise
    lock_lib.release(lock)
    cache_dir = rundir.data_cache_dir(config, workdir)
    return tokenizer, data_lib.prepare_token_stores(config.data, tokenizer, cache_dir)  # (found)


def _build_data(
    config: schema.Experiment, workdir: str, start: init_from.Start | None
) -> data_lib.Tokenizer:
    """The run's vocabulary (the start's for a fine-tuning run; else given, found or trained)
    and its training split's token store, each built by process 0 where missing; returns the
    vocabulary. ``start``: `init_from.apply`'s."""
    cache_dir = rundir.data_cache_dir(config, workdir)
    multihost.check_shared([workdir, cache_dir], rundir.SHARED_CHECK)  # (multi-host runs)
    copy = lambda: init_from.copy_vocabulary(start, config, workdir)  # noqa: E731
    multihost.on_main(copy, 'copy the vocabulary of train.init_from')  # (a fine-tuning run's)
    tokenizer = rundir.get_tokenizer(config, workdir)
    if cache_dir:  # the other processes open the stores once process 0 has them
        prepare = functools.partial(
            data_lib.prepare_token_stores, config.data, tokenizer, cache_dir
        )
        multihost.on_main(lambda: prepare() and None, 'prepare the training data')
    return tokenizer


def _best_record(workdir: str, meta: dict | None, latest: int | None) -> dict | None:
    """The checkpoint ``meta`` to continue the best-score record from. The last step of a run
    is saved before its final validation (training/loop.py), so when that run finished, its
    final_metrics.json at the same step holds the record after that validation."""
    if latest is None or not os.path.exists(rundir.path(workdir, rundir.FINAL_METRICS_FILE)):
        return meta
    final = rundir.read_final_metrics(workdir)
    if final.get('step') != latest or 'best' not in final:
        return meta
    return {**(meta or {}), 'best': final['best']}
