"""Validation during training: loss, BLEU, the best checkpoint and early stopping.

`Validation` builds the evaluation sets once per run; `validate` computes what is due at a
step, writes it, and lets transformer/best.py's tracker decide whether ``WORKDIR/best`` is
replaced and whether the run stops early.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from absl import logging

from transformer import data as data_lib
from transformer import evaluate, multihost, parallel, steps
from transformer import metrics as metrics_lib
from transformer import workdir as workdir_lib

if TYPE_CHECKING:
    from transformer import trainer

PyTree = Any


class Validation:
    """Validation loss and BLEU on evaluation sets built once per run."""

    def __init__(self, run: trainer.Run):
        self._run = run
        self.loss_set = self._eval_set(None)
        if not self.loss_set.references:  # the last step is always validated
            data = run.config.data
            raise data_lib.DataError(
                f'The {data.eval_split!r} split (data.eval_split) of {data.dataset} has no '
                'examples; validation needs some (for the synthetic task: '
                'data.synthetic.num_validation >= 1).'
            )
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
            for key, value in parallel.fetch(self._run.parallel.eval_step(params, inputs)).items():
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


def validate(
    run: trainer.Run,
    validation: Validation,
    writer: metrics_lib.MetricWriter,
    step: int,
    final: dict[str, Any],
    loss: bool,
    bleu: bool,
) -> bool:
    """Validation loss and/or BLEU at ``step``; a new best BLEU replaces ``WORKDIR/best``.

    Returns:
      Whether early stopping (``train.early_stop_patience``) ends the run here.
    """
    params = run.parallel.host_params(run.state)
    if loss:
        final['validation'] = metrics = validation.loss(params)
        logging.info(
            'step %d  validation loss %.4f  nll %.4f  perplexity %.2f  accuracy %.4f',
            *(step, metrics['loss'], metrics['nll'], metrics['perplexity']),
            metrics['accuracy'],
        )
        writer.write(step, 'validation', metrics)
    if not bleu:
        return False
    scores = validation.bleu(params)
    # Process 0's scores decide for every process (whether to save a best checkpoint, a
    # collective, and whether to stop): another process's BLEU may differ in its last bit.
    final['validation_bleu'] = scores = dict(
        zip(scores, multihost.broadcast_floats(list(scores.values())), strict=True)
    )
    writer.write(step, 'validation', scores)
    best = run.best
    if best.update(step, scores):
        # Global arrays, as every checkpoint holds (Orbax refuses host-local ones when the
        # run spans several processes).
        global_params = run.parallel.global_state(run.state).params
        workdir_lib.save_best(
            run.best_manager, global_params, {**best.state(), 'metric': best.metric}, run.workdir
        )
    logging.info(
        'step %d  validation %s  (best %s %.2f at step %d)',
        *(step, scores, best.metric, best.score, best.step),
    )
    if best.should_stop:
        logging.info(
            'Early stopping: %d BLEU evaluations without improvement; the best checkpoint '
            '(step %d) is in %s.',
            *(best.evals_since_best, best.step, workdir_lib.path(run.workdir, workdir_lib.BEST)),
        )
    return best.should_stop
