"""The training loop, its metrics and the train command.

``python train.py --config configs/X.py --workdir DIR`` (also ``transformer-train``).

`setup` builds everything a run needs (vocabulary, model, optimizer, `Parallel`, train state
restored from the latest checkpoint, data iterator at its saved position, evaluation sets);
`train_and_evaluate` runs the loop on it: one step per batch, a console line and metrics
every ``train.log_every`` steps, validation loss / BLEU, checkpoints. What a step computes is
in transformer/steps.py, how it is spread over devices in transformer/parallel.py, and what
the run directory holds in transformer/workdir.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging

from transformer import console, evaluate, optim, steps
from transformer import data as data_lib
from transformer import workdir as workdir_lib
from transformer.model import Transformer
from transformer.parallel import Parallel
from transformer.steps import TrainState

PyTree = Any


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message says why and what was kept."""


@dataclasses.dataclass
class Run:
    """Everything `setup` builds for a training run."""

    config: ml_collections.ConfigDict
    workdir: str
    tokenizer: data_lib.Tokenizer
    model: Transformer
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    parallel: Parallel
    state: TrainState  # in the parallel mode's device layout
    train_iter: data_lib.TrainIterator
    manager: ocp.CheckpointManager
    dropout_rng: jax.Array
    num_params: int
    restored_step: int | None  # the checkpoint this run resumed from

    @property
    def is_main(self) -> bool:
        return jax.process_index() == 0


def setup(config: ml_collections.ConfigDict, workdir: str, *, devices=None) -> Run:
    """Builds a run in ``workdir``, restored from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval).
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the devices to use (default: all local ones).
    """
    tc = config.train
    if tc.distributed:
        jax.distributed.initialize()
    os.makedirs(workdir, exist_ok=True)
    tokenizer = workdir_lib.get_tokenizer(config, workdir)
    model = steps.build_model(config, tokenizer.vocab_size)
    tx, schedule = optim.make_optimizer(config.opt, config.model.d_model)
    parallel = Parallel.from_config(config, model, tx, schedule, devices)
    rows_needed = parallel.num_data_shards * tc.grad_accum_steps * jax.process_count()
    if tc.batch_size % rows_needed:
        raise ValueError(
            f'train.batch_size={tc.batch_size} must be a multiple of devices x grad_accum_steps '
            f'x processes = {rows_needed}.'
        )
    init_rng = jax.random.split(jax.random.key(tc.seed))[0]
    dropout_rng = steps.dropout_key(tc.seed, tc.get('dropout_prng', 'threefry'))
    state = steps.init_state(model, tx, init_rng, config.data.max_len)
    train_iter = data_lib.make_train_iterator(
        config.data,
        tokenizer,
        batch_size=tc.batch_size,
        seed=tc.seed,
        cache_dir=workdir_lib.data_cache_dir(config, workdir),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    manager = workdir_lib.checkpoint_manager(workdir, config)
    latest = manager.latest_step()
    if latest is not None:
        state, meta = workdir_lib.restore_state(
            manager, latest, workdir_lib.abstract_tree(state), workdir
        )
        train_iter.set_state(meta['data_state'])
        logging.info('Resumed from %s at step %d.', workdir, latest)
    if jax.process_index() == 0:
        # Written once the config is known to fit the checkpoints, so that a mistaken resume
        # never overwrites the description of what is saved.
        workdir_lib.write_config(workdir, config)
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    logging.info(
        'Model: %s parameters, %s; %s mode over %d devices.',
        f'{num_params:,}',
        model.config,
        tc.parallelism,
        len(parallel.devices),
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
        manager=manager,
        dropout_rng=dropout_rng,
        num_params=num_params,
        restored_step=latest,
    )


class MetricWriter:
    """Metrics to ``WORKDIR/metrics.jsonl`` and TensorBoard event files (process 0 only)."""

    def __init__(self, workdir: str, enabled: bool):
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._jsonl = open(workdir_lib.path(workdir, workdir_lib.METRICS_FILE), 'a')  # noqa: SIM115
        import tensorflow as tf  # TensorBoard event files; imported lazily (slow import).

        self._tf = tf
        self._tb = tf.summary.create_file_writer(workdir_lib.path(workdir, workdir_lib.TENSORBOARD))

    def write(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        record = {'step': step, 'split': split, **{k: float(v) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(record) + '\n')
        self._jsonl.flush()
        with self._tb.as_default(step=step):
            for key, value in metrics.items():
                self._tf.summary.scalar(f'{split}/{key}', float(value))
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def _format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{secs:02d}s'


class TrainLog:
    """Sums of the steps since the last console line, turned into per-token metrics."""

    def __init__(self, run: Run, step: int):
        self._run = run
        self._sums: dict[str, float] = {}
        self._since_time, self._since_step = time.time(), step

    def add(self, sums: Mapping[str, Any]) -> None:
        for key in (*steps.SUM_KEYS, 'source_tokens'):
            self._sums[key] = self._sums.get(key, 0.0) + sums[key]

    def flush(self, step: int, last: Mapping[str, Any]) -> dict[str, float]:
        """Metrics since the last flush (``last``: the latest step's sums), printed once."""
        run, tc = self._run, self._run.config.train
        elapsed = max(time.time() - self._since_time, 1e-9)
        metrics = steps.summarize(
            {**self._sums, 'grad_norm': last['grad_norm'], 'learning_rate': last['learning_rate']},
            run.tokenizer.vocab_size,
            tc.label_smoothing,
        )
        metrics['steps_per_s'] = (step - self._since_step) / elapsed
        tokens = float(self._sums['tokens']) + float(self._sums['source_tokens'])
        metrics['tokens_per_s'] = tokens / elapsed
        eta = (tc.num_steps - step) / max(metrics['steps_per_s'], 1e-9)
        logging.info(
            'step %d/%d  loss %.4f  nll %.4f  acc %.3f  lr %.3g  %.2f steps/s  %s tokens/s  ETA %s',
            step,
            tc.num_steps,
            metrics['loss'],
            metrics['nll'],
            metrics['accuracy'],
            metrics['learning_rate'],
            metrics['steps_per_s'],
            f'{metrics["tokens_per_s"]:,.0f}',
            _format_duration(eta),
        )
        self._sums = {}
        self._since_time, self._since_step = time.time(), step
        return metrics


class Validation:
    """Validation loss and BLEU on evaluation sets built once per run."""

    def __init__(self, run: Run):
        self._run = run
        self.loss_set = self._eval_set(None)
        limit = run.config.eval.bleu_max_examples
        full = limit <= 0 or limit >= len(self.loss_set.references)
        self.bleu_set = self.loss_set if full else self._eval_set(limit)

    def _eval_set(self, max_examples: int | None) -> data_lib.EvalSet:
        run = self._run
        return data_lib.make_eval_set(
            run.config.data,
            run.tokenizer,
            run.config.data.eval_split,
            batch_size=run.config.eval.batch_size,
            cache_dir=workdir_lib.data_cache_dir(run.config, run.workdir),
            max_examples=max_examples,
        )

    def loss(self, params: PyTree) -> dict[str, float]:
        """Summed validation loss / NLL / accuracy over every evaluation batch."""
        totals: dict[str, float] = {}
        for batch in self.loss_set.batches:
            inputs = {'inputs': batch['inputs'], 'targets': batch['targets']}
            for key, value in jax.device_get(self._run.parallel.eval_step(params, inputs)).items():
                totals[key] = totals.get(key, 0.0) + float(value)
        run = self._run
        return steps.summarize(totals, run.tokenizer.vocab_size, run.config.train.label_smoothing)

    def bleu(self, params: PyTree) -> dict[str, float]:
        """BLEU of the validation split (or its first ``eval.bleu_max_examples`` sentences),
        decoded and scored exactly as ``transformer.evaluate`` does."""
        run = self._run
        scores, _ = evaluate.score_eval_set(
            run.config,
            run.tokenizer,
            run.model,
            params,
            self.bleu_set,
            beam_size=run.config.eval.beam_size,
            alpha=run.config.eval.alpha,
        )
        return {key: scores[key] for key in ('sacrebleu', 'tokenized_bleu', 'chrf')}


def _check_finite(run: Run, step: int, sums: Mapping[str, Any], last_saved: int | None) -> None:
    if np.isfinite(sums['loss']) and np.isfinite(sums['grad_norm']):
        return
    run.manager.wait_until_finished()
    kept = f'step {last_saved}' if last_saved is not None else 'none'
    raise TrainingError(
        f'Non-finite loss or gradient at step {step} (loss={sums["loss"]}, '
        f'grad_norm={sums["grad_norm"]}); stopped. Last good checkpoint: {kept} in '
        f'{run.workdir}/{workdir_lib.CHECKPOINTS}. Lower opt.lr_scale or raise opt.warmup_steps.'
    )


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    devices=None,
    on_step: Callable[[int, dict], None] | None = None,
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, resuming from its latest checkpoint if there is one.

    Args:
      config: the experiment config (sections model, data, opt, train, eval).
      workdir: where the vocabulary, config, checkpoints and metrics live.
      devices: the local devices to use (default: all).
      on_step: optional callback (step, metrics) after every logged step (tests use it).

    Returns:
      The final train and validation metrics and the wall time.
    """
    start_time = time.time()
    run = setup(config, workdir, devices=devices)
    tc, parallel = config.train, run.parallel
    validation = Validation(run)
    writer = MetricWriter(workdir, enabled=run.is_main)
    step = first_step = int(parallel.get_state(run.state).step)
    log, last_saved, final = TrainLog(run, step), run.restored_step, {}
    while step < tc.num_steps:
        run.state, sums = parallel.train_step(run.state, next(run.train_iter), run.dropout_rng)
        step += 1
        is_last = step == tc.num_steps
        is_log = step % tc.log_every == 0 or is_last
        is_ckpt = step % tc.checkpoint_every == 0 or is_last
        if is_log or is_ckpt:
            sums = jax.device_get(sums)
            _check_finite(run, step, sums, last_saved)
        log.add(sums)
        if is_log:
            final['train'] = log.flush(step, sums)
            writer.write(step, 'train', final['train'])
            if on_step is not None:
                on_step(step, final['train'])
        params = parallel.get_state(run.state).params
        if (tc.eval_every and step % tc.eval_every == 0) or is_last:
            final['validation'] = metrics = validation.loss(params)
            logging.info(
                'step %d  validation loss %.4f  nll %.4f  perplexity %.2f  accuracy %.4f',
                *(step, metrics['loss'], metrics['nll'], metrics['perplexity']),
                metrics['accuracy'],
            )
            writer.write(step, 'validation', metrics)
        bleu_every = config.eval.bleu_every
        if bleu_every and (step % bleu_every == 0 or is_last):
            final['validation_bleu'] = validation.bleu(params)
            logging.info('step %d  validation %s', step, final['validation_bleu'])
            writer.write(step, 'validation', final['validation_bleu'])
        if is_ckpt:
            state = parallel.get_state(run.state)
            workdir_lib.save_state(run.manager, state, run.train_iter.get_state(), tc.seed)
            last_saved = step
    run.manager.wait_until_finished()
    writer.close()
    final.update(
        step=step,
        steps_this_run=step - first_step,
        wall_time_s=time.time() - start_time,
        num_params=run.num_params,
    )
    if run.is_main:
        with open(workdir_lib.path(workdir, workdir_lib.FINAL_METRICS_FILE), 'w') as f:
            json.dump(final, f, indent=2)
    return final


def cli(argv: list[str] | None = None) -> None:
    """``python train.py --config configs/X.py --workdir DIR`` (also ``transformer-train``)."""
    from absl import flags
    from ml_collections import config_flags

    console.define_flag(
        'config',
        config_flags.DEFINE_config_file,
        None,
        'Experiment config file, e.g. configs/base.py.',
        lock_config=True,
    )
    console.define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')

    def main(_):
        console.require('config', 'workdir')
        try:
            final = train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
        except (TrainingError, workdir_lib.WorkdirError, data_lib.DataError, ValueError) as e:
            raise SystemExit(f'error: {e}') from None
        logging.info('Done: %s', json.dumps(final))

    console.run(main, argv)
