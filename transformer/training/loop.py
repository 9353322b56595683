"""The training loop.

`setup` builds everything a run needs (vocabulary, model, optimizer, `Parallel`, train state
restored from the latest checkpoint, data iterator at its saved position, evaluation sets);
`train_and_evaluate` runs the loop on it: one step per batch, a console line and metrics
every ``train.log_every`` steps, validation loss / BLEU, checkpoints. What a step computes is
in transformer/training/steps.py, how it is spread over devices and hosts in
transformer/training/parallel.py, and what the run directory holds in transformer/rundir.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from transformer import data as data_lib
from transformer import lock as lock_lib
from transformer import multihost, rundir, schema
from transformer.backends import fetch
from transformer.checkpoint import Checkpoints
from transformer.model import Transformer
from transformer.training import config_checks, optim, steps
from transformer.training import metrics as metrics_lib
from transformer.training import validation as validation_lib
from transformer.training.best import BestTracker
from transformer.training.parallel import Parallel
from transformer.training.steps import TrainState

PyTree = Any


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message says why and what was kept."""


class Interrupted(TrainingError):
    """Ctrl-C stopped the loop; the message names the checkpoint to resume from."""


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


def init_distributed(tc: Any) -> None:
    """Joins the processes of a multi-host run (``train.distributed``), before jax is used.

    ``train.coordinator_address`` / ``num_processes`` / ``process_id`` go to
    ``jax.distributed.initialize``; unset, the cluster (SLURM, TPU pods, ...) is detected.
    A process that cannot reach the coordinator stops after ``train.init_timeout_s``.
    """
    if not tc.distributed:
        return
    kwargs = {
        key: getattr(tc, key)
        for key in ('coordinator_address', 'num_processes', 'process_id')
        if getattr(tc, key) is not None
    }
    address = kwargs.get('coordinator_address')
    if address and kwargs.get('process_id', 0) != 0:
        # jax aborts the process (after its own timeout, with a page of C++ stack) when the
        # coordinator never answers; a plain TCP probe first turns that into one line.
        _wait_for_coordinator(address, tc.init_timeout_s)
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=int(tc.init_timeout_s))
    except Exception as e:  # noqa: BLE001 - jax raises several types here; all mean the same
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise TrainingError(
            f'Could not join the run of {kwargs.get("num_processes", "?")} processes at '
            f'{kwargs.get("coordinator_address", "the auto-detected coordinator")} within '
            f'{tc.init_timeout_s} s (train.init_timeout_s): {first_line}'
        ) from None
    if jax.process_index() != 0:
        logging.set_verbosity(logging.WARNING)  # only process 0 logs progress


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    host, _, port = address.rpartition(':')
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise TrainingError(
                    f'No coordinator answers at {address} (train.coordinator_address) after '
                    f'{timeout_s} s (train.init_timeout_s): {e.strerror or e}. Start process 0 '
                    'first, or check the address and port.'
                ) from None
            time.sleep(0.2)


def setup(config: schema.Config, workdir: str, *, devices=None) -> Run:
    """Builds a run in ``workdir``, restored from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval): from a config
        file, parsed here once into its typed sections (transformer/schema/), or typed.
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the devices to use (default: all devices of all processes).

    From here on this process holds ``WORKDIR/train.lock`` (`transformer.lock`): a second
    training run in the same workdir stops in one line. ``lock.release(run.lock)`` gives it
    back (`train_and_evaluate` does when it returns).
    """
    if not isinstance(config, schema.Experiment):
        config = schema.complete(config)  # a config file written before a field existed
    init_distributed(config.train)
    # Before anything is written; now that the processes have joined, the batch is checked
    # against the devices of all of them.
    config = config_checks.check(config, jax.devices() if devices is None else devices)
    created = rundir.create(workdir)  # or one line on a path of the wrong kind
    lock = lock_lib.acquire(workdir)
    try:
        return _setup(config, workdir, devices, lock)
    except BaseException:
        lock_lib.release(lock)
        if created and lock is not None:
            lock_lib.remove_unused(workdir)  # a bad data path leaves no empty run directory
        raise


def _setup(config: schema.Experiment, workdir: str, devices, lock) -> Run:
    tc = config.train
    # Before anything is written: a changed model or data, a missing config.json or vocabulary
    changes = rundir.resume_changes(workdir, config) if rundir.has_checkpoints(workdir) else []
    tokenizer = rundir.get_tokenizer(config, workdir)
    model = steps.build_model(config, tokenizer.vocab_size)
    tx, schedule = optim.make_optimizer(config.opt, config.model.d_model, tc.num_steps)
    parallel = Parallel.from_config(config, model, tx, schedule, devices)
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
    )
    checkpoints = Checkpoints(workdir, config)
    # Restored straight into this run's global layout, whatever the layout that saved it.
    restored = checkpoints.restore_latest(parallel.abstract_state(init))
    state, meta, latest = restored or (parallel.init_state(init), None, None)
    if latest is not None:
        _warn_on_another_dropout_prng(workdir, config)
        train_iter.set_state(meta['data_state'])
        logging.info('Resumed from %s at step %d.', workdir, latest)
    _keep_record(workdir, config, latest, changes)
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    cfg = model.config
    logging.info(
        'Model: %s parameters (d_model %d, %d heads, %d+%d layers, d_ff %d, %s); %s mode '
        'over %d devices of %d processes.',
        *(f'{num_params:,}', cfg.d_model, cfg.num_heads, cfg.num_encoder_layers),
        *(cfg.num_decoder_layers, cfg.d_ff, jnp.dtype(cfg.dtype).name, tc.parallelism),
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
        best=BestTracker.from_config(config, meta),
        dropout_rng=dropout_rng,
        num_params=num_params,
        restored_step=latest,
        lock=lock,
    )


def _warn_on_another_dropout_prng(workdir: str, config: schema.Experiment) -> None:
    """Resuming draws other dropout masks than an uninterrupted run would: say so."""
    if os.path.exists(rundir.path(workdir, rundir.CONFIG_FILE)):
        if warning := steps.resumed_prng_warning(rundir.read_config(workdir).train, config.train):
            logging.warning(warning)


def _keep_record(workdir: str, config: schema.Experiment, latest, changes) -> None:
    """config.json describes what the run started with: written when it starts (no step
    restored); a resume adds the settings it changes, one line each on the console and in
    config_history.jsonl (written once the config is known to fit the checkpoints)."""
    if latest is None:
        if multihost.is_main():
            rundir.write_config(workdir, config)
        return
    for key, old, new in changes:
        logging.info('Resuming at step %d with %s=%r (was %r).', latest, key, new, old)
    if changes and multihost.is_main():
        rundir.record_changes(workdir, latest, changes)


def _train_step(run: Run, batch, compiling: bool) -> tuple[TrainState, dict]:
    """One step; the first of a process compiles it (jit dispatch waits for the compiler),
    which takes a while on a big model and is said."""
    if compiling:
        logging.info('Compiling the training step ...')
        start = time.perf_counter()
    state, sums = run.parallel.train_step(run.state, batch, run.dropout_rng)
    if compiling:
        logging.info('Compiled the training step in %.1f s.', time.perf_counter() - start)
    return state, sums


def _check_finite(run: Run, step: int, sums: Mapping[str, Any]) -> None:
    """Stops on a non-finite loss or gradient, naming the newest checkpoint that verifies;
    right after a resume it says that this checkpoint itself may be the cause."""
    if np.isfinite(sums['loss']) and np.isfinite(sums['grad_norm']):
        return
    run.checkpoints.seal()
    good = run.checkpoints.newest_verified()
    where = f'{run.workdir}/{rundir.CHECKPOINTS}'
    kept = f'step {good} in {where}' if good is not None else f'none in {where}'
    message = (
        f'Non-finite loss or gradient at step {step} (loss={sums["loss"]}, '
        f'grad_norm={sums["grad_norm"]}); stopped. Newest verified checkpoint: {kept}. '
    )
    since = None if run.restored_step is None else step - run.restored_step
    if since is not None and since <= run.config.train.log_every:
        message += (
            f'The run resumed from step {run.restored_step} only {since} step(s) before, so '
            'that checkpoint itself may be bad (its values, not only the learning rate): move '
            f'checkpoints/{run.restored_step} away to resume from an earlier step, or lower '
            'opt.lr_scale / raise opt.warmup_steps.'
        )
    else:
        message += 'Lower opt.lr_scale or raise opt.warmup_steps.'
    raise TrainingError(message)


def _interrupted(workdir: str, step: int, newest: int | None) -> Interrupted:
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


def train_and_evaluate(
    config: schema.Config,
    workdir: str,
    *,
    devices=None,
    on_step: Callable[[int, dict], None] | None = None,
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, resuming from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval), as `setup`
        takes it.
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the devices to use (default: all devices of all processes).
      on_step: optional callback (step, metrics) after every logged step (tests use it).

    Returns:
      The final train and validation metrics and the wall time.
    """
    start_time = time.time()
    run = setup(config, workdir, devices=devices)
    try:
        return _train(run, start_time, on_step)
    finally:
        lock_lib.release(run.lock)


def _train(run: Run, start_time: float, on_step) -> dict[str, Any]:
    config, workdir = run.config, run.workdir
    tc, parallel = config.train, run.parallel
    step = first_step = int(fetch(parallel.global_state(run.state).step))
    done = rundir.path(workdir, rundir.FINAL_METRICS_FILE)
    if (step >= tc.num_steps or run.best.should_stop) and os.path.exists(done):
        # A finished run (or a smaller train.num_steps) trains nothing and rewrites nothing.
        logging.info(
            'The run in %s is at step %d (train.num_steps=%d%s): nothing to train; its final '
            'metrics stay in %s.',
            *(workdir, step, tc.num_steps, ', stopped early' * run.best.should_stop, done),
        )
        final = rundir.read_final_metrics(workdir)
        return {**final, 'steps_this_run': 0, 'wall_time_s': time.time() - start_time}
    validation = validation_lib.Validation(config, run.tokenizer, run.model, parallel, workdir)
    writer = metrics_lib.MetricWriter(
        rundir.path(workdir, rundir.METRICS_FILE),
        rundir.path(workdir, rundir.TENSORBOARD),
        enabled=run.is_main,
        start_step=step,
    )
    log, final = metrics_lib.TrainLog(run, step), {}
    stopped_early = run.best.should_stop  # a restarted run that had already stopped early
    if stopped_early:
        logging.info('Early stopping ended this run at step %d; nothing to train.', step)
    bleu_every = config.eval.bleu_every
    batches = data_lib.Prefetcher(run.train_iter, parallel.put_batch, depth=tc.prefetch)
    try:
        while step < tc.num_steps and not stopped_early:
            batch, data_state = next(batches)
            run.state, sums = _train_step(run, batch, compiling=step == first_step)
            step += 1
            is_last = step == tc.num_steps
            is_log = step % tc.log_every == 0 or is_last
            is_ckpt = step % tc.checkpoint_every == 0 or is_last
            if is_log or is_ckpt:
                sums = fetch(sums)
                _check_finite(run, step, sums)
            log.add(sums)
            if is_log:
                final['train'] = log.flush(step, sums, batches.wait_s)
                writer.write(step, 'train', final['train'])
                if on_step is not None:
                    on_step(step, final['train'])
            is_loss = (tc.eval_every and step % tc.eval_every == 0) or is_last
            is_bleu = bool(bleu_every) and (step % bleu_every == 0 or is_last)
            if is_loss or is_bleu:
                stopped_early = validation_lib.validate(
                    validation,
                    run.state,
                    run.best,
                    run.checkpoints,
                    writer,
                    *(step, final, is_loss, is_bleu),
                )
            if is_ckpt or stopped_early:
                state = parallel.global_state(run.state)
                meta = {'data_state': dict(data_state), 'seed': tc.seed, 'best': run.best.state()}
                run.checkpoints.save(state, meta)
    except BaseException as e:
        # Whatever stops the loop (an error, Ctrl-C), the save in flight is finished first.
        newest = run.checkpoints.finish()
        if isinstance(e, KeyboardInterrupt):
            raise _interrupted(workdir, step, newest) from None
        raise
    finally:
        batches.close()
    run.checkpoints.seal()  # the regular saves and the best checkpoint
    writer.close()
    final.update(
        step=step,
        steps_this_run=step - first_step,
        best=run.best.state(),
        stopped_early=stopped_early,
        wall_time_s=time.time() - start_time,
        num_params=run.num_params,
    )
    if run.is_main:
        with open(rundir.path(workdir, rundir.FINAL_METRICS_FILE), 'w') as f:
            json.dump(final, f, indent=2)
    return final
