"""The training loop.

`setup` (transformer/training/run_setup.py) builds everything a run needs (vocabulary, model,
optimizer, `Parallel`, train state restored from the latest checkpoint, data iterator at its
saved position); `train_and_evaluate` runs the loop on it: one step per batch, a console line
and metrics every ``train.log_every`` steps, validation loss / BLEU, checkpoints. What a step
computes is in transformer/training/steps.py, how it is spread over devices and hosts in
transformer/training/parallel.py, and what the run directory holds in transformer/rundir.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from transformer import data as data_lib
from transformer import lock as lock_lib
from transformer import rundir, schema
from transformer.backends import fetch
from transformer.training import metrics as metrics_lib
from transformer.training import stops
from transformer.training import validation as validation_lib
from transformer.training.run_setup import Run, setup

PyTree = Any


def train_and_evaluate(
    config: schema.Config,
    workdir: str,
    *,
    devices=None,
    on_step: Callable[[int, dict], None] | None = None,
    overridden: Sequence[str] = (),
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, resuming from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval), as `setup`
        takes it.
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the devices to use (default: all devices of all processes).
      on_step: optional callback (step, metrics) after every logged step (tests use it).
      overridden: the config keys set on the command line (`setup`).

    Returns:
      The final train and validation metrics and the wall time.
    """
    start_time = time.time()
    run = setup(config, workdir, devices=devices, overridden=overridden)
    try:
        return _train(run, start_time, on_step)
    finally:
        lock_lib.release(run.lock)


def _train(run: Run, start_time: float, on_step) -> dict[str, Any]:
    config, workdir = run.config, run.workdir
    tc, parallel = config.train, run.parallel
    step = first_step = int(fetch(parallel.global_state(run.state).step))
    finished = _finished(run, step, start_time)
    if finished is not None:
        return finished
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
            batch, data_state, pairs = next(batches)
            run.state, sums = parallel.train_step(run.state, batch, run.dropout_rng)
            step += 1
            is_last = step == tc.num_steps
            is_log = step % tc.log_every == 0 or is_last
            is_ckpt = step % tc.checkpoint_every == 0 or is_last
            if is_log or is_ckpt:
                sums = fetch(sums)
                stops.check_finite(
                    run.checkpoints,
                    *(step, sums),
                    restored_step=run.restored_step,
                    log_every=tc.log_every,
                )
            log.add(sums, pairs)
            if is_log:
                final['train'] = log.flush(step, sums, batches.wait_s)
                writer.write(step, 'train', final['train'])
                if on_step is not None:
                    on_step(step, final['train'])
            if is_last:  # saved before its validation: see _final_validation
                _save(run, data_state)
                break
            is_loss = tc.eval_every and step % tc.eval_every == 0
            is_bleu = bool(bleu_every) and step % bleu_every == 0
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
                _save(run, data_state)
        if step >= tc.num_steps and not stopped_early:
            stopped_early = _final_validation(run, validation, writer, step, final)
    except BaseException as e:
        # Whatever stops the loop (an error, Ctrl-C), the save in flight is finished first.
        newest = run.checkpoints.finish()
        if isinstance(e, KeyboardInterrupt):
            raise stops.interrupted(workdir, step, newest) from None
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


def _finished(run: Run, step: int, start_time: float) -> dict[str, Any] | None:
    """The final metrics of a finished run (or one a smaller train.num_steps ends), which
    trains nothing and rewrites nothing; None when there is training to do."""
    tc, done = run.config.train, rundir.path(run.workdir, rundir.FINAL_METRICS_FILE)
    if not ((step >= tc.num_steps or run.best.should_stop) and os.path.exists(done)):
        return None
    logging.info(
        'The run in %s is at step %d (train.num_steps=%d%s): nothing to train; its final '
        'metrics stay in %s.',
        *(run.workdir, step, tc.num_steps, ', stopped early' * run.best.should_stop, done),
    )
    final = rundir.read_final_metrics(run.workdir)
    return {**final, 'steps_this_run': 0, 'wall_time_s': time.time() - start_time}


def _save(run: Run, data_state) -> None:
    """The train state as a checkpoint, with the data position and the best-score record."""
    state = run.parallel.global_state(run.state)
    meta = {'data_state': dict(data_state), 'seed': run.config.train.seed}
    run.checkpoints.save(state, meta | {'best': run.best.state()})


def _final_validation(run: Run, validation, writer, step: int, final: dict) -> bool:
    """Validation loss (and BLEU, with ``eval.bleu_every``) of the last step, whose checkpoint
    is saved before it: a run stopped during it (Ctrl-C, a deadline) keeps its last step, and
    the same command resumes there, trains nothing and validates again. That checkpoint's
    best-score record is the one before this validation; final_metrics.json holds the one
    after (`run_setup` continues from it)."""
    return validation_lib.validate(
        validation,
        run.state,
        run.best,
        run.checkpoints,
        writer,
        *(step, final, True, bool(run.config.eval.bleu_every)),
    )
