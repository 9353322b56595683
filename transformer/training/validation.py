"""Validation during training: loss, BLEU, the best checkpoint and early stopping.

`Validation` builds the evaluation sets once per run; `validate` computes what is due at a
step, writes it, and lets transformer/training/best.py's tracker decide whether ``WORKDIR/best`` is
replaced and whether the run stops early.
"""

from __future__ import annotations

from typing import Any

from absl import logging

from transformer import data as data_lib
from transformer import decoding, multihost, rundir, schema
from transformer.backends import fetch
from transformer.checkpoint import Checkpoints
from transformer.evaluation import score_eval_set
from transformer.model import Transformer
from transformer.schema import METRICS
from transformer.training import metrics as metrics_lib
from transformer.training import parallel, steps
from transformer.training.best import BestTracker
from transformer.training.decode_layout import training_layout
from transformer.training.steps import TrainState

PyTree = Any


class Validation:
    """Validation loss and BLEU on evaluation sets built once per run."""

    def __init__(
        self,
        config: schema.Experiment,
        tokenizer: data_lib.Tokenizer,
        model: Transformer,
        parallel: parallel.Parallel,
        workdir: str,
    ):
        self.config, self.model = config, model
        # A multilingual run validates on its own pair: the codes in the sources and labels,
        # the target code forced first in each output.
        self.tokenizer = data_lib.run_pair(config.data, tokenizer)
        self.parallel, self.workdir = parallel, workdir
        # Loss and BLEU run on the training mesh, each batch's rows split over its data axis
        # and the processes, the parameters in the training layout.
        self.layout = training_layout(parallel)
        self.loss_set = self._eval_set(None)
        if not self.loss_set.references:  # the last step is always validated
            data = config.data
            raise data_lib.DataError(
                f'The {data.eval_split!r} split (data.eval_split) of {data.dataset} has no '
                'examples; validation needs some.'
            )
        limit = config.eval.bleu_max_examples
        full = limit <= 0 or limit >= len(self.loss_set.references)
        self.bleu_set = self.loss_set if full else self._eval_set(limit)

    def _eval_set(self, max_examples: int | None) -> data_lib.EvalSet:
        config = self.config
        return data_lib.make_eval_set(
            config.data,
            self.tokenizer,
            config.data.eval_split,
            batch_size=config.eval.batch_size,
            cache_dir=rundir.data_cache_dir(config, self.workdir),
            max_examples=max_examples,
        )

    def loss(self, params: PyTree) -> dict[str, float]:
        """Summed validation loss / NLL / accuracy over every evaluation batch, each batch's
        rows split over the mesh (`decoding.place_rows`; filler rows weigh nothing); the sums
        are global, the same on every process."""
        totals: dict[str, float] = {}
        for batch in self.loss_set.batches:
            rows = {'inputs': batch['inputs'], 'targets': batch['targets']}
            placed = decoding.place_rows(rows, self.layout, self.tokenizer.special)
            for key, value in fetch(self.parallel.eval_step(params, placed)).items():
                totals[key] = totals.get(key, 0.0) + float(value)
        smoothing = self.config.train.label_smoothing
        return steps.summarize(totals, self.tokenizer.vocab_size, smoothing)

    def bleu(self, params: PyTree) -> dict[str, float]:
        """BLEU of the validation split (or its first ``eval.bleu_max_examples`` sentences),
        decoded and scored exactly as ``transformer.evaluate`` does."""
        config = self.config
        scores, _ = score_eval_set(
            config,
            self.tokenizer,
            self.model,
            params,
            self.bleu_set,
            beam_size=config.eval.beam_size,
            options=decoding.decode_options(
                config.eval, forced=data_lib.pair_forced(self.tokenizer)
            ),
            layout=self.layout,
        )
        return {key: scores[key] for key in METRICS}


def validate(
    validation: Validation,
    state: TrainState,
    best: BestTracker,
    checkpoints: Checkpoints,
    writer: metrics_lib.MetricWriter,
    step: int,
    final: dict[str, Any],
    loss: bool,
    bleu: bool,
) -> bool:
    """Validation loss and/or BLEU at ``step`` of ``state`` (the train state in the step's
    layout); a new best BLEU (``best`` is updated) replaces ``WORKDIR/best``.

    Returns:
      Whether early stopping (``train.early_stop_patience``) ends the run here.
    """
    par, workdir = validation.parallel, validation.workdir
    params = validation.layout.place(par.global_state(state).params)  # the training layout
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
    # Every process scored the same gathered hypotheses; process 0's scores still decide for
    # every process (whether to save a best checkpoint, a collective, and whether to stop),
    # so that no decision hangs on two processes computing a float alike.
    final['validation_bleu'] = scores = dict(
        zip(scores, multihost.broadcast_floats(list(scores.values())), strict=True)
    )
    writer.write(step, 'validation', scores)
    if best.update(step, scores):
        # Global arrays, as every checkpoint holds (Orbax refuses host-local ones when the
        # run spans several processes).
        global_params = par.global_state(state).params
        meta = {**best.state(), 'metric': best.metric}
        checkpoints.save_best(global_params, meta)
    logging.info(
        'step %d  validation sacreBLEU %.2f  tokenized BLEU %.2f  chrF %.2f  chrF++ %.2f  '
        '(best %s %.2f at step %d)',
        *(step, scores['sacrebleu'], scores['tokenized_bleu'], scores['chrf'], scores['chrf++']),
        *(best.metric, best.score, best.step),
    )
    if best.should_stop:
        logging.info(
            'Early stopping: %d BLEU evaluations without improvement; the best checkpoint '
            '(step %d) is in %s.',
            *(best.evals_since_best, best.step, rundir.path(workdir, rundir.BEST)),
        )
    return best.should_stop
