"""Export a trained run to Hugging Face (safetensors: its pretrained family's) or CTranslate2.

``python -m transformer.export --workdir W --out DIR [--format hf|ctranslate2]``

The run's config decides first whether the model can be exported at all
(`check_expressible`, the list of refusals), before the format's packages are asked for or a
checkpoint is read. ``--format hf`` writes the pretrained family the run came from
(converted_from.json's, or its vocabulary's; a run trained here is a MarianMT): the family
writes its files (transformer/interop/); transformer/commands/ctranslate2_spec.py writes the
CTranslate2 model (directly, in a process of its own). Each declares what it writes of a
model (its `Format`, transformer/formats.py), and refuses the rest.
"""

from __future__ import annotations

import importlib.util
import os

from absl import logging

from transformer import decoding, files, interop, rundir, schema
from transformer.checkpoint import load_model
from transformer.commands import console, ctranslate2_spec, ownership
from transformer.data import DataError
from transformer.formats import ExportError, Format
from transformer.model import export_refusal

# The --format values: a pretrained family's own format ('hf': the family the run came from,
# `run_family`) and CTranslate2's.
FORMATS = ('hf', ctranslate2_spec.WRITES.flag)
QUANTIZATIONS = ('int8',)


def run_family(workdir: str, config: schema.Experiment) -> interop.Family:
    """The family whose format ``--format hf`` writes for the run: the one it was converted
    from, or whose vocabulary it holds, else a run trained here's (`interop.export_family`)."""
    try:
        held = rundir.pretrained_vocab_dir(config, workdir)
        vocabulary = interop.held_vocabulary(held) if held else None
        return interop.export_family(rundir.converted_family(workdir), vocabulary)
    except (rundir.WorkdirError, interop.PretrainedError) as e:
        raise ExportError(str(e)) from None


def declarations(family: interop.Family) -> dict[str, Format]:
    """Each format's declaration of what it writes, by its --format value."""
    return {'hf': family.writes, ctranslate2_spec.WRITES.flag: ctranslate2_spec.WRITES}


def load_run(workdir: str, step: int | None, average_last: int | None):
    """(config, tokenizer, model, params, steps): the one call into the run-directory API."""
    try:
        return load_model(workdir, step, average_last, scan_layers=False)  # the per-layer tree
    except (rundir.WorkdirError, DataError) as e:
        raise ExportError(str(e)) from None


def read_run_config(workdir: str) -> schema.Experiment:
    """The run's config, read before anything else of the run."""
    try:
        return rundir.read_config(workdir)
    except rundir.WorkdirError as e:
        raise ExportError(str(e)) from None


def check_expressible(
    config: schema.Experiment, format: str, family: interop.Family | None = None
) -> None:
    """The list of refusals: an `ExportError` (one line) for a run that ``format`` cannot
    represent, decided from its config alone, before the format's packages are asked for or a
    checkpoint is read. Each format writes the values of the model's variant fields and
    numeric settings its declaration names (transformer/formats.py) and refuses every other,
    naming the formats that write it. ``family``: the one ``--format hf`` writes (`run_family`;
    default: a run trained here's). (An odd d_model with sinusoids, or an odd head size with
    rotary positions, is no config at all: `variants.check`.)"""
    if config.data.pretokenize != 'none':  # Moses runs outside the SentencePiece model
        raise ExportError(
            f'data.pretokenize={config.data.pretokenize!r} cannot be exported: --format={format} '
            'reads text through the SentencePiece model alone, without Moses; translate with '
            'this project (transformer.translate or its Python api) instead.'
        )
    cfg = config.model
    formats = declarations(family or interop.family_named(interop.DEFAULT_FAMILY))
    refusal = export_refusal(cfg, formats[format], tuple(formats.values()))
    if refusal:
        raise ExportError(refusal)


def export(
    workdir: str,
    out: str,
    *,
    step: int | None = None,
    average_last: int | None = None,
    format: str = 'hf',
    quantization: str | None = None,
    overwrite: bool = False,
) -> list[int]:
    """Exports a run's (averaged) parameters to ``out``; returns the checkpoint steps used.

    ``out`` may be absent or an empty directory; with ``overwrite`` also an earlier export of
    this project, which is replaced: its mark (`ownership.EXPORT_MARK_FILE`, written with
    every export) lists every file it holds. Anything else there (the run, a directory above
    it, another run, a model this project did not write, other files) is refused in one line
    (`ownership.export_refusal`) before the run is read. Everything is written into a
    temporary sibling of ``out`` that is renamed at the end (`files.write_in_place`), so a
    failure leaves ``out`` as it was.
    """
    if format not in FORMATS:
        raise ExportError(f'--format={format} is unknown; use one of {", ".join(FORMATS)}.')
    if quantization not in (None, *QUANTIZATIONS):
        raise ExportError(f'--quantization={quantization} is unknown; use one of {QUANTIZATIONS}.')
    if quantization is not None and format != 'ctranslate2':
        raise ExportError(f'--quantization={quantization} applies to --format=ctranslate2 only.')
    out = os.path.abspath(out)
    refusal = ownership.export_refusal(out, workdir, overwrite)
    if refusal:
        raise ExportError(refusal)
    run_config = read_run_config(workdir)
    family = run_family(workdir, run_config)
    check_expressible(run_config, format, family)
    check_can_export(format, out)
    config, tokenizer, model, params, steps = load_run(workdir, step, average_last)
    try:
        source = rundir.converted_source(workdir)  # a converted run's files come back
    except rundir.WorkdirError as e:
        raise ExportError(str(e)) from None

    def build(scratch: str) -> str:
        if format == 'ctranslate2':
            return ctranslate2_spec.write_ctranslate2(
                scratch, model.config, config, tokenizer, params, quantization=quantization
            )
        directory = os.path.join(scratch, 'hf')
        os.mkdir(directory)
        exponent = decoding.length_power(config.eval.alpha, config.eval.length_penalty)
        args = (model.config, config, tokenizer, params, source)
        family.write(directory, *args, length_exponent=exponent)
        return directory

    mark = ownership.export_mark(format, workdir, steps, quantization)
    try:
        files.write_in_place(out, build, mark=mark, replace=overwrite)
    except files.NotReplaceable as e:  # changed while the run was read and written
        raise ExportError(f'{e}: nothing was written; export into a new directory.') from None
    logging.info('Exported %s (checkpoints %s) as %s to %s.', workdir, steps, format, out)
    return steps


# The modules each format imports, all from the ``export`` extra (pyproject.toml).
EXTRA_MODULES = {
    'hf': ('safetensors',),
    'ctranslate2': ('ctranslate2',),
}


def check_can_export(format: str, out: str) -> str:
    """What an export needs before the run is loaded: the ``export`` extra's modules (an
    `ExportError` with the pip command) and a parent directory of ``out`` that takes files;
    returns that directory."""
    for module in EXTRA_MODULES[format]:
        if importlib.util.find_spec(module) is None:
            raise ExportError(
                f'--format={format} needs the export extra ({module} is not installed): '
                "pip install 'transformer[export]' (from a checkout: pip install -e '.[export]')."
            )
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    problem = files.unwritable(parent)
    if problem:
        raise ExportError(f'Cannot write into {parent} ({problem}); --out names another place.')
    return parent


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.export --workdir W --out DIR`` (also ``transformer-export``)."""
    from absl import flags

    define = console.define_flag
    define('workdir', flags.DEFINE_string, None, 'Directory of the training run.')
    define('step', flags.DEFINE_integer, None, 'Export this checkpoint alone.')
    define(
        'average_last',
        flags.DEFINE_integer,
        None,
        'Average the last K checkpoints (default: eval.average_last).',
        lower_bound=1,
    )
    define('out', flags.DEFINE_string, None, 'Directory to write the exported model to.')
    define(
        'format',
        flags.DEFINE_enum,
        'hf',
        FORMATS,
        "hf (the run's pretrained family's format; MarianMT for a run trained here) or "
        'ctranslate2.',
    )
    define('quantization', flags.DEFINE_enum, None, QUANTIZATIONS, 'CTranslate2 weights.')
    define('overwrite', flags.DEFINE_bool, False, 'Replace an earlier export in --out.')
    FLAGS = flags.FLAGS
    # absl keeps parsed values for the whole process: a second in-process call (tests) must
    # not inherit the first one's --format or --quantization.
    for name in ('workdir', 'step', 'average_last', 'out', 'format', 'quantization', 'overwrite'):
        FLAGS[name].unparse()

    def main(_):
        console.require('workdir', 'out')
        try:
            steps = export(
                FLAGS.workdir,
                FLAGS.out,
                step=FLAGS.step,
                average_last=FLAGS.average_last,
                format=FLAGS.format,
                quantization=FLAGS.quantization,
                overwrite=FLAGS.overwrite,
            )
        except ExportError as e:
            raise SystemExit(f'error: {e}') from None
        print(f'Exported checkpoints {steps} as {FLAGS.format} to {FLAGS.out}')

    console.run(main, argv)


if __name__ == '__main__':
    cli()
