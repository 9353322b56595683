"""The evaluate command: decode a split of a trained run and score it.

``python -m transformer.evaluate --workdir DIR [--step N | --average_last K | --best]
[--split test]``

Checkpoints are loaded (and averaged) by `transformer.checkpoint.load_model`, and the split is
decoded and scored by transformer/evaluation/score.py; `run` writes the hypotheses and a JSON
of the scores to ``WORKDIR/eval/SPLIT-STEP[-avgK]-beamB-alphaA-RULE[-ensembleM].txt`` / ``.json``
(STEP: the last step loaded, ``bestN`` with ``--best``), unless ``--output`` names the file.
The sentences are split over the devices of the run's layout (``--parallelism``,
``--model_parallelism``, ``--fsdp`` override its ``train`` keys) and over the processes of a
multi-process evaluate (``--coordinator_address``, ``--num_processes``, ``--process_id``);
process 0 writes the files, whose JSON holds ``devices``, ``processes`` and
``sentences_per_process``.
With ``--sampling``, ``sample-tT-kK-pP-seedS`` takes the place of the beam settings; with
``--min_length`` or ``--no_repeat_ngram``, ``-minL-ngramN`` follows them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from absl import logging

from transformer import data as data_lib
from transformer import decoding, files, multihost, rundir, training
from transformer.checkpoint import load_model
from transformer.commands import console, decoding_run, ownership
from transformer.evaluation import score_eval_set
from transformer.model import Transformer
from transformer.schema import ConfigError

PyTree = Any


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.evaluate --workdir DIR ...`` (also ``transformer-evaluate``)."""
    from absl import flags

    console.define_decoding_flags()
    define = console.define_flag
    define('split', flags.DEFINE_string, None, 'Split to decode (default: data.test_split).')
    define('source', flags.DEFINE_string, None, 'Decode this file (one sentence a line) instead '
           'of a split; with --reference.')  # fmt: skip
    define('reference', flags.DEFINE_string, None, "--source's reference translations, aligned.")
    define(
        'max_examples',
        flags.DEFINE_integer,
        0,
        'Decode only the first N sentences (0 = all).',
        lower_bound=0,
    )
    define('output', flags.DEFINE_string, None, 'Hypotheses file (default: WORKDIR/eval/...).')
    FLAGS = flags.FLAGS

    def main(_):
        console.require('workdir')
        files = _check_file_flags(FLAGS)
        sampling, constraints = console.search_settings()
        if sampling is not None and sampling.num_samples > 1:
            console.usage_exit(
                'evaluate scores one output a sentence: --num_samples must be 1 (translate '
                '--num_samples N writes N).'
            )
        decoding_run.join_processes(
            FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.init_timeout_s
        )
        try:
            run(
                FLAGS.workdir,
                step=FLAGS.step,
                average_last=FLAGS.average_last,
                best=FLAGS.best,
                split=FLAGS.split,
                beam_size=FLAGS.beam_size,
                alpha=FLAGS.alpha,
                length_penalty=FLAGS.length_penalty,
                batch_size=FLAGS.batch_size,
                max_examples=FLAGS.max_examples,
                output=FLAGS.output,
                ensemble=FLAGS.ensemble,
                gather_params=FLAGS.gather_params,
                **{key: FLAGS[key].value for key in decoding_run.LAYOUT_KEYS},
                sampling=sampling,
                constraints=constraints,
                source_tag=FLAGS.source_tag,
                source_lang=FLAGS.source_lang,
                target_lang=FLAGS.target_lang,
                files=files,
                scan_layers=FLAGS.scan_layers,
            )
        except (rundir.WorkdirError, data_lib.DataError, ConfigError) as e:
            raise SystemExit(f'error: {e}') from None

    console.run(main, argv, out_of_memory_hint=console.DECODING_OUT_OF_MEMORY)


def _check_file_flags(FLAGS: Any) -> tuple[str, str] | None:
    """(--source, --reference) when given, None for a split; one usage line otherwise."""
    if (FLAGS.source is None) != (FLAGS.reference is None):
        console.usage_exit('--source and --reference go together: a file and its references.')
    if FLAGS.source is not None and FLAGS.split is not None:
        console.usage_exit('Give --split or --source/--reference, not both.')
    console.check_paths(
        {'source': FLAGS.source, 'reference': FLAGS.reference}, {'output': FLAGS.output}
    )
    refusal = FLAGS.output and ownership.scores_refusal(FLAGS.output)
    if refusal:
        console.usage_exit(f'--output={FLAGS.output}: {refusal}')
    return None if FLAGS.source is None else (FLAGS.source, FLAGS.reference)


def load(
    run_dir: str,
    step: int | None,
    average_last: int | None,
    best: bool,
    ensemble: Sequence[str] = (),
) -> tuple[Any, data_lib.Tokenizer, Transformer, PyTree, list[list[int]]]:
    """(config, tokenizer, model, params, the steps loaded of each run) of ``run_dir``, or of it
    and the ``ensemble`` runs decoded together (`ensemble.load_ensemble`)."""
    if ensemble:
        return decoding.load_ensemble([run_dir, *ensemble], step, average_last, best)
    config, tokenizer, model, params, steps = load_model(run_dir, step, average_last, best)
    return config, tokenizer, model, params, [steps]


def make_eval_set(
    config: Any,
    tokenizer: data_lib.Tokenizer,
    run_dir: str,
    split: str,
    batch_size: int | None = None,
    max_examples: int = 0,
) -> data_lib.EvalSet:
    """Every sentence of ``split`` (or its first ``max_examples``), batched for decoding."""
    return data_lib.make_eval_set(
        config.data,
        tokenizer,
        split,
        batch_size=batch_size or config.eval.batch_size,
        cache_dir=rundir.data_cache_dir(config, run_dir),
        max_examples=max_examples or None,
    )


def _eval_set(
    config: Any,
    tokenizer: data_lib.Tokenizer,
    run_dir: str,
    split: str,
    files: tuple[str, str] | None,
    batch_size: int,
    max_examples: int,
) -> data_lib.EvalSet:
    """The `EvalSet` of ``split``, or of a source file and its references (``files``); their
    first ``max_examples`` (0: all)."""
    if not files:
        return make_eval_set(config, tokenizer, run_dir, split, batch_size, max_examples)
    lines = []
    for file in files:
        with open(file, 'rb') as f:
            lines.append(data_lib.decode_lines(f.read(), file))
    sources, references = lines
    if len(sources) != len(references):
        raise data_lib.DataError(
            f'--reference={files[1]} has {len(references)} lines and --source={files[0]} '
            f'{len(sources)}: give one reference a source line.'
        )
    if max_examples:
        sources, references = sources[:max_examples], references[:max_examples]
    return data_lib.eval_set_of_lines(
        tokenizer, sources, references, batch_size=batch_size, name=os.path.basename(files[0])
    )


def _eval_output(run_dir: str, stem: str, output: str | None) -> str:
    """``output``, else ``WORKDIR/eval/<stem>.txt`` once the directory is known to take files;
    a one-line `WorkdirError` where the scores beside it would replace a file that is not
    evaluate's (`ownership.scores_refusal`)."""
    output = output or _default_output(run_dir, stem)
    refusal = ownership.scores_refusal(output)
    if refusal:
        raise rundir.WorkdirError(refusal)
    return output


def _default_output(run_dir: str, stem: str) -> str:
    directory = rundir.path(run_dir, rundir.EVAL_DIR)
    try:
        os.makedirs(directory, exist_ok=True)
        problem = files.unwritable(directory)
    except OSError as e:
        problem = e.strerror or str(e)
    if problem:
        raise rundir.WorkdirError(
            f'Cannot write the hypotheses and scores to {directory} ({problem}); --output FILE '
            'writes them elsewhere.'
        )
    return os.path.join(directory, f'{stem}.txt')


def _write_outputs(output: str, hypotheses: Sequence[str], scores: dict[str, Any]) -> None:
    """The hypotheses to ``output`` and the scores beside it (``.json``); an OSError names
    the file (a full disk says it on close, without one)."""
    for file, write in (
        (output, lambda f: f.writelines(h + '\n' for h in hypotheses)),
        (os.path.splitext(output)[0] + '.json', lambda f: json.dump(scores, f, indent=2)),
    ):
        try:
            with open(file, 'w') as f:
                write(f)
        except OSError as e:
            raise OSError(e.errno, e.strerror, e.filename or file) from None


def _stem(
    split: str,
    steps: Sequence[int],
    best: bool,
    beam_size: int,
    alpha: float,
    length_penalty: str,
    sampling: decoding.Sampling | None,
    constraints: decoding.Constraints | None,
) -> str:
    """The output's name without ``.txt``: the split, the checkpoints and every setting that
    changes the output, so that a grid of settings keeps one file each (benchmarks/
    eval_sweep.py's names end alike) and a sampled file never replaces a beam one."""
    stem = f'{split}-' + (f'best{steps[0]}' if best else f'{steps[-1]}')
    stem += f'-avg{len(steps)}' if len(steps) > 1 else ''
    if sampling is not None:
        stem += f'-{sampling.name}'
    else:
        stem += f'-beam{beam_size}-alpha{alpha}-{length_penalty}'
    if constraints is not None:
        stem += f'-min{constraints.min_length}-ngram{constraints.no_repeat_ngram}'
    return stem


def _settings_record(**settings: Any) -> dict[str, Any]:
    """The JSON record of the sampling and constraint settings that are on."""
    return {name: dataclasses.asdict(value) for name, value in settings.items() if value}


def run(
    run_dir: str,
    *,
    step: int | None = None,
    average_last: int | None = None,
    best: bool = False,
    split: str | None = None,
    beam_size: int | None = None,
    alpha: float | None = None,
    length_penalty: str | None = None,
    batch_size: int | None = None,
    max_examples: int = 0,
    output: str | None = None,
    ensemble: Sequence[str] = (),
    gather_params: bool = False,
    devices: Sequence[Any] | None = None,
    sampling: decoding.Sampling | None = None,
    constraints: decoding.Constraints | None = None,
    files: tuple[str, str] | None = None,
    **load_flags: Any,
) -> dict[str, Any]:
    """Loads, decodes, scores and writes hypotheses + a JSON of scores; returns the scores.

    ``ensemble``: other runs decoded together with ``run_dir`` (`ensemble.load_ensemble`): the
    next-token distribution is the mean of the runs' probabilities. The sentences are split
    over ``devices`` (default: every process's) on the run's layout
    (`decoding_run.load_run`; ``load_flags``: ``parallelism``, ``model_parallelism``,
    ``fsdp``, ``scan_layers`` override the run's; ``source_tag``, a token first in every
    source; ``source_lang`` and ``target_lang``, a multilingual run's pair, which the output's
    name ends with); process 0 alone prints and writes.
    ``sampling``: one sample a sentence, seeded by the sentence's index in the split.
    ``constraints``: a minimum length and n-gram blocking. ``files``: (source, reference)
    files decoded and scored instead of a split, named by the source file's name.
    """
    start = time.time()
    _ = [settings.check() for settings in (sampling, constraints) if settings is not None]
    ensemble = [os.fspath(other) for other in ensemble]
    loaded = decoding_run.load_run(
        run_dir,
        **dict(step=step, average_last=average_last, best=best, ensemble=ensemble),
        **dict(gather_params=gather_params, devices=devices, **load_flags),
    )
    config, tokenizer, layout = loaded.config, loaded.tokenizer, loaded.layout
    steps = loaded.member_steps[0]
    split = os.path.basename(files[0]) if files else split or config.data.test_split
    beam_size = config.eval.beam_size if beam_size is None else beam_size
    alpha = config.eval.alpha if alpha is None else alpha
    length_penalty = length_penalty or config.eval.length_penalty
    sentences = batch_size or config.eval.batch_size
    training.check_decoding(
        config, sentences, beam_size, tokenizer.vocab_size,
        devices=layout.local_devices, data_shards=layout.data_shards,
    )  # fmt: skip
    logging.info(
        'Evaluating %s on %s: checkpoints %s, beam %d, alpha %.2f (%s), %d devices.',
        *(' + '.join([run_dir, *ensemble]), split, steps, beam_size, alpha, length_penalty),
        len(layout.devices),
    )
    stem = _stem(split, steps, best, beam_size, alpha, length_penalty, sampling, constraints)
    stem += f'-ensemble{len(ensemble) + 1}' if ensemble else ''
    stem += f'-{loaded.pair[0]}-{loaded.pair[1]}' if loaded.pair else ''
    _ = files or decoding_run.check_split(run_dir, config, split)
    output = _eval_output(run_dir, stem, output)  # before the decode it would hold
    eval_set = _eval_set(config, tokenizer, run_dir, split, files, sentences, max_examples)
    options = loaded.options(alpha, length_penalty)
    scores, hypotheses = score_eval_set(
        *(config, tokenizer, loaded.model, loaded.params, eval_set),
        **dict(beam_size=beam_size, options=options, layout=layout),
        **dict(sampling=sampling, constraints=constraints),
    )
    scores.update(
        split=split,
        steps=steps,
        **dict(beam_size=beam_size, alpha=alpha, length_penalty=length_penalty),
        direction='->'.join(loaded.pair or (config.data.source_lang, config.data.target_lang)),
        # Whether line i of the hypotheses is sentence i of the official test set.
        order=(files is None and data_lib.order_note(config.data, split)) or 'original',
        **decoding_run.layout_summary(
            layout, decoding.sentences_per_process(eval_set.batches, layout)
        ),
        wall_time_s=time.time() - start,
    )
    if ensemble:
        scores.update(ensemble=[run_dir, *ensemble], ensemble_steps=loaded.member_steps)
    scores.update(_settings_record(sampling=sampling, constraints=constraints))
    if multihost.is_main():
        _report(output, hypotheses, scores)
    return scores


def _report(output: str, hypotheses: Sequence[str], scores: dict[str, Any]) -> None:
    """The scores on stdout, then the files. The scores first, so that a disk that fills up
    while the files are written loses nothing of the decode but the files."""
    print(f'sacreBLEU {scores["sacrebleu"]:.2f}  {scores["sacrebleu_signature"]}')
    print(f'tokenized BLEU {scores["tokenized_bleu"]:.2f}  ({scores["tokenized_bleu_convention"]})')
    print(f'chrF {scores["chrf"]:.2f}  {scores["chrf_signature"]}')
    print(f'chrF++ {scores["chrf++"]:.2f}  {scores["chrf++_signature"]}', flush=True)
    _write_outputs(output, hypotheses, scores)
    print(f'hypotheses: {output}')
    if scores['order'] != 'original':
        print(f'order: {scores["order"]}')


if __name__ == '__main__':
    cli()
