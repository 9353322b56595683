"""BLEU from checkpoints: loading and averaging, decoding a split, scoring it two ways.

``python -m transformer.evaluate --workdir DIR [--step N | --average_last K] [--split test]``

Two BLEU numbers are reported because they are not comparable (../README.md, "BLEU"):

- sacreBLEU on cased, detokenized text, with its signature: the comparable modern number.
- tokenized BLEU as the paper reported it: Moses-tokenized hypotheses and references
  (optionally lowercased and punctuation-normalised, as the Multi30k literature does), with
  tensor2tensor's compound splitting of hyphens ("##AT##-##AT##") for WMT14 EN-DE; then
  plain corpus BLEU on those tokens (what multi-bleu.perl computes).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from transformer import console
from transformer import data as data_lib
from transformer import decode as decode_lib
from transformer.model import Transformer, config_from_dict

PyTree = Any


class EvaluationError(RuntimeError):
    """A workdir, checkpoint or vocabulary that cannot be evaluated; the message says why."""


# ---------------------------------------------------------------------------------------------
# BLEU.

_COMPOUND = re.compile(r'(\S)-(\S)')


def split_compounds(text: str) -> str:
    """tensor2tensor's get_ende_bleu.sh: "a-b" -> "a ##AT##-##AT## b" (after tokenization)."""
    # One left-to-right pass, like the script's `s{(\S)-(\S)}{...}g`: in "a-b-c" only the
    # first hyphen is split, and the number must match the script's.
    return _COMPOUND.sub(r'\1 ##AT##-##AT## \2', text)


def moses_tokenize(
    lines: Sequence[str],
    lang: str,
    *,
    lowercase: bool = False,
    normalize_punctuation: bool = False,
    compound_split: bool = False,
) -> list[str]:
    """Moses tokenization (sacremoses), optionally lowercased, normalised, compound-split."""
    tokenizer = MosesTokenizer(lang=lang)
    normalizer = MosesPunctNormalizer(lang=lang) if normalize_punctuation else None
    out = []
    for line in lines:
        if lowercase:
            line = line.lower()
        if normalizer is not None:
            line = normalizer.normalize(line)
        line = tokenizer.tokenize(line, escape=False, return_str=True)
        out.append(split_compounds(line) if compound_split else line)
    return out


def bleu_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    target_lang: str,
    lowercase_tokenized: bool = False,
    compound_split: bool = False,
) -> dict[str, Any]:
    """sacreBLEU (cased, detokenized) + tokenized BLEU + chrF of detokenized hypotheses.

    Args:
      hypotheses: one detokenized hypothesis per reference.
      references: the raw references.
      target_lang: the language Moses tokenizes for.
      lowercase_tokenized: lowercase and punctuation-normalise before tokenizing (the
        Multi30k convention of the `*.lc.norm.tok.*` files).
      compound_split: tensor2tensor's hyphen splitting (the paper's WMT14 EN-DE number).

    Returns:
      A JSON-ready dict of scores and signatures.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} references.')
    sacre = BLEU(trg_lang=target_lang)
    sacre_score = sacre.corpus_score(list(hypotheses), [list(references)])
    chrf = CHRF()
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    tok_options = dict(
        lowercase=lowercase_tokenized,
        normalize_punctuation=lowercase_tokenized,
        compound_split=compound_split,
    )
    tok_hyps = moses_tokenize(hypotheses, target_lang, **tok_options)
    tok_refs = moses_tokenize(references, target_lang, **tok_options)
    tokenized = BLEU(tokenize='none', force=True).corpus_score(tok_hyps, [tok_refs])
    description = 'moses' + ''.join(
        f'+{name}'
        for name, on in [('lc+norm', lowercase_tokenized), ('compound-split', compound_split)]
        if on
    )
    return {
        'sacrebleu': sacre_score.score,
        'sacrebleu_signature': str(sacre.get_signature()),
        'sacrebleu_detail': str(sacre_score),
        'tokenized_bleu': tokenized.score,
        'tokenized_bleu_convention': description,
        'tokenized_bleu_detail': str(tokenized),
        'chrf': chrf_score.score,
        'chrf_signature': str(chrf.get_signature()),
        'num_sentences': len(hypotheses),
    }


# ---------------------------------------------------------------------------------------------
# Workdirs and checkpoints.


def load_workdir_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a training run saved in ``workdir/config.json``."""
    path = os.path.join(workdir, 'config.json')
    if not os.path.exists(path):
        raise EvaluationError(
            f'{path} not found: --workdir must be a directory written by train.py.'
        )
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


def load_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> data_lib.Tokenizer:
    """The run's SentencePiece model; never trains a new one (that would not match)."""
    path = config.data.get('vocab_path') or os.path.join(workdir, 'vocab', 'spm.model')
    if not os.path.exists(path):
        raise EvaluationError(
            f'No vocabulary at {path}: the workdir has no trained SentencePiece model '
            '(copy it there or set data.vocab_path).'
        )
    return data_lib.get_tokenizer(config.data, workdir)


def _manager(workdir: str) -> ocp.CheckpointManager:
    directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    if not os.path.isdir(directory):
        raise EvaluationError(f'No checkpoints in {workdir}: {directory} does not exist.')
    options = ocp.CheckpointManagerOptions(read_only=True, create=False)
    return ocp.CheckpointManager(
        directory, options=options, item_names=('params', 'opt_state', 'meta')
    )


def checkpoint_steps(workdir: str, step: int | None = None, average_last: int = 1) -> list[int]:
    """The steps to load: ``[step]``, or the last ``average_last`` saved ones."""
    manager = _manager(workdir)
    steps = sorted(manager.all_steps())
    if not steps:
        raise EvaluationError(f'No complete checkpoint in {workdir}/checkpoints.')
    if step is not None:
        if step not in steps:
            raise EvaluationError(f'No checkpoint for step {step} in {workdir}; saved: {steps}.')
        return [step]
    if average_last > len(steps):
        logging.warning(
            'Asked to average the last %d checkpoints but only %d exist; averaging those.',
            average_last,
            len(steps),
        )
    return steps[-average_last:]


def abstract_params(model: Transformer) -> PyTree:
    """Shapes and dtypes of the model's parameters, without allocating them."""
    dummy = jnp.ones((1, 8), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy)['params'])


def restore_params(workdir: str, step: int, model: Transformer) -> PyTree:
    """The parameters saved at ``step``, checked against the model's shapes."""
    manager = _manager(workdir)
    target = abstract_params(model)
    try:
        restored = manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target))
        )
    except (ValueError, KeyError, FileNotFoundError, TypeError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EvaluationError(
            f'Checkpoint {workdir}/checkpoints/{step} does not fit the model of its '
            f'config.json or is incomplete: {first_line[:300]}'
        ) from None
    params = restored['params']
    got = jax.tree.map(lambda x: x.shape, params)
    want = jax.tree.map(lambda x: x.shape, target)
    if got != want:
        raise EvaluationError(
            f'Checkpoint {workdir}/checkpoints/{step} has parameter shapes that differ from the '
            'model in config.json.'
        )
    return params


def average_params(trees: Sequence[PyTree]) -> PyTree:
    """The element-wise mean of parameter trees (the paper averages checkpoints, Sec. 6.1)."""
    if not trees:
        raise ValueError('No parameter trees to average.')
    return jax.tree.map(lambda *xs: sum(np.asarray(x, np.float64) for x in xs) / len(xs), *trees)


def load_model(
    workdir: str, step: int | None = None, average_last: int | None = None
) -> tuple[ml_collections.ConfigDict, data_lib.Tokenizer, Transformer, PyTree, list[int]]:
    """Config, tokenizer, model and parameters of a training run.

    Args:
      workdir: the run's directory.
      step: load this checkpoint alone.
      average_last: otherwise average the last K checkpoints (default: the run's
        ``eval.average_last``).

    Returns:
      (config, tokenizer, model, params, the steps loaded).
    """
    config = load_workdir_config(workdir)
    tokenizer = load_tokenizer(config, workdir)
    model = Transformer(config_from_dict(config.model, tokenizer.vocab_size))
    if step is None and average_last is None:
        average_last = config.eval.average_last
    steps = checkpoint_steps(workdir, step, average_last or 1)
    trees = [restore_params(workdir, s, model) for s in steps]
    params = trees[0] if len(trees) == 1 else average_params(trees)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    return config, tokenizer, model, params, steps


# ---------------------------------------------------------------------------------------------
# Decoding a split.


def translate_batches(
    model: Transformer,
    params: PyTree,
    tokenizer: data_lib.Tokenizer,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    beam_size: int,
    alpha: float,
    extra_length: int,
) -> list[str]:
    """Detokenized best hypotheses for evaluation batches, in the original example order."""
    outputs = []
    for i, batch in enumerate(batches):
        tokens = decode_lib.translate_batch(
            model,
            params,
            jnp.asarray(batch['inputs']),
            beam_size=beam_size,
            alpha=alpha,
            extra_length=extra_length,
        )
        tokens = np.asarray(jax.device_get(tokens))
        outputs.append([tokenizer.decode(row.tolist()) for row in tokens])
        if (i + 1) % 10 == 0 or i + 1 == len(batches):
            logging.info('Decoded %d/%d batches.', i + 1, len(batches))
    return data_lib.restore_order(batches, outputs)


def evaluate_split(
    config: ml_collections.ConfigDict,
    tokenizer: data_lib.Tokenizer,
    model: Transformer,
    params: PyTree,
    split: str,
    *,
    beam_size: int,
    alpha: float,
    extra_length: int,
    batch_size: int,
    max_examples: int = 0,
    workdir: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Decodes ``split`` and scores it against its raw references."""
    _, references = data_lib.load_text(config.data, split)
    batches = data_lib.make_eval_batches(
        config.data,
        tokenizer,
        split,
        batch_size=batch_size,
        workdir=workdir,
        max_examples=max_examples or None,
    )
    hypotheses = translate_batches(
        model,
        params,
        tokenizer,
        batches,
        beam_size=beam_size,
        alpha=alpha,
        extra_length=extra_length,
    )
    references = references[: len(hypotheses)]
    target_lang = config.data.target_lang
    scores = bleu_scores(
        hypotheses,
        references,
        target_lang=target_lang,
        lowercase_tokenized=bool(config.eval.get('lowercase_tokenized', False)),
        compound_split=bool(config.eval.get('compound_split', False)),
    )
    return scores, hypotheses


def define_decoding_flags() -> None:
    """Flags shared by the evaluate and translate commands: which checkpoint, which search."""
    from absl import flags

    define = console.define_flag
    define('workdir', flags.DEFINE_string, None, 'Directory of the training run.')
    define('step', flags.DEFINE_integer, None, 'Checkpoint step to load (default: the latest).')
    define(
        'average_last',
        flags.DEFINE_integer,
        None,
        'Average the last K checkpoints (default: eval.average_last).',
    )
    define('beam_size', flags.DEFINE_integer, None, 'Beam size; 1 = greedy (default: config).')
    define('alpha', flags.DEFINE_float, None, 'Length penalty alpha (default: eval.alpha).')
    define('batch_size', flags.DEFINE_integer, None, 'Sentences per batch (default: config).')


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.evaluate --workdir DIR ...`` (also ``transformer-evaluate``)."""
    from absl import flags

    define_decoding_flags()
    define = console.define_flag
    define('split', flags.DEFINE_string, None, 'Split to decode (default: data.test_split).')
    define('max_examples', flags.DEFINE_integer, 0, 'Decode only the first N sentences (0 = all).')
    define('output', flags.DEFINE_string, None, 'Hypotheses file (default: WORKDIR/eval/...).')
    FLAGS = flags.FLAGS

    def main(_):
        console.require('workdir')
        try:
            run(
                FLAGS.workdir,
                step=FLAGS.step,
                average_last=FLAGS.average_last,
                split=FLAGS.split,
                beam_size=FLAGS.beam_size,
                alpha=FLAGS.alpha,
                batch_size=FLAGS.batch_size,
                max_examples=FLAGS.max_examples,
                output=FLAGS.output,
            )
        except (EvaluationError, data_lib.DataError) as e:
            raise SystemExit(f'error: {e}') from None

    console.run(main, argv)


def run(
    workdir: str,
    *,
    step: int | None = None,
    average_last: int | None = None,
    split: str | None = None,
    beam_size: int | None = None,
    alpha: float | None = None,
    batch_size: int | None = None,
    max_examples: int = 0,
    output: str | None = None,
) -> dict[str, Any]:
    """Loads, decodes, scores and writes hypotheses + a JSON of scores; returns the scores."""
    start = time.time()
    config, tokenizer, model, params, steps = load_model(workdir, step, average_last)
    split = split or config.data.test_split
    beam_size = config.eval.beam_size if beam_size is None else beam_size
    alpha = config.eval.alpha if alpha is None else alpha
    logging.info(
        'Evaluating %s on %s: checkpoints %s, beam %d, alpha %.2f.',
        workdir,
        split,
        steps,
        beam_size,
        alpha,
    )
    scores, hypotheses = evaluate_split(
        config,
        tokenizer,
        model,
        params,
        split,
        beam_size=beam_size,
        alpha=alpha,
        extra_length=config.eval.extra_length,
        batch_size=batch_size or config.eval.batch_size,
        max_examples=max_examples,
        workdir=workdir,
    )
    scores.update(
        split=split,
        steps=steps,
        beam_size=beam_size,
        alpha=alpha,
        direction=f'{config.data.source_lang}->{config.data.target_lang}',
        wall_time_s=time.time() - start,
    )
    stem = f'{split}-{steps[-1]}' + (f'-avg{len(steps)}' if len(steps) > 1 else '')
    if output is None:
        os.makedirs(os.path.join(workdir, 'eval'), exist_ok=True)
        output = os.path.join(workdir, 'eval', f'{stem}.txt')
    with open(output, 'w') as f:
        f.writelines(h + '\n' for h in hypotheses)
    with open(os.path.splitext(output)[0] + '.json', 'w') as f:
        json.dump(scores, f, indent=2)
    print(f'sacreBLEU {scores["sacrebleu"]:.2f}  {scores["sacrebleu_signature"]}')
    print(f'tokenized BLEU {scores["tokenized_bleu"]:.2f}  ({scores["tokenized_bleu_convention"]})')
    print(f'chrF {scores["chrf"]:.2f}  {scores["chrf_signature"]}')
    print(f'hypotheses: {output}')
    return scores


if __name__ == '__main__':
    cli()
