"""The convert command: a pretrained model directory (Hugging Face MarianMT/OPUS-MT, M2M100,
NLLB-200, mBART-50, T5 / MADLAD-400) into a run directory.

``python -m transformer.convert --from_hf DIR --workdir W [--config CONFIG]``
(also ``transformer-convert``)

DIR is a local model directory as the hub serves it, of a family this project reads
(transformer/interop/, which picks the family from DIR's config.json: a MarianMT's
model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json,
tokenizer_config.json, optionally generation_config.json; an M2M100's, NLLB-200's,
mBART-50's or T5's weights beside their tokenizer files, docs/pretrained.md); nothing is
downloaded. A directory no family recognises stops in one line naming the families known.
W becomes a run directory that evaluate, translate, score, visualize, export and
``api.load`` take as they take a trained one: its config.json (the model's settings; the
data and evaluation sections of ``--config`` when given, with its ``--config.*`` overrides,
else a data section that names only the language pair; of its model section, how the model
is computed: `FREE_FIELDS`), the model's vocabulary (vocab/), and a sealed checkpoint of the
parameters at step 0.
The beam size and length penalty are those Hugging Face's ``generate`` applies to DIR: from
generation_config.json (or, without one, config.json), and where a file names none,
transformers' defaults (one beam, length_penalty 1.0), always with Hugging Face's rule of a
beam's log-probability divided by length^length_penalty (eval.length_penalty 'fairseq');
the command prints them and where each came from, and converted_from.json records that, the
family, and DIR's config files as they were, which the run's export writes back.
Everything is read and checked before anything is written, and W is written under a
temporary name and renamed, so a failed conversion leaves nothing; a non-empty W is refused.
A converted run has no optimizer state: train from it with ``--config.train.init_from=W``
(or DIR itself) in a new work directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from transformer import configs, files, interop, rundir, schema
from transformer import data as data_lib
from transformer.checkpoint import save_params
from transformer.commands import console
from transformer.commands.config_flag import explain_flag_error
from transformer.interop import Pretrained, PretrainedError
from transformer.model import (
    DTYPE_FIELDS,
    HOW_FIELDS,
    Transformer,
    abstract_params,
    config_from_dict,
    convert_layer_layout,
)

# The model fields a config may set for a converted model: how it is computed, not what.
FREE_FIELDS = (*HOW_FIELDS, *DTYPE_FIELDS)


def experiment_config(
    pretrained: Pretrained, base: Any | None, added: int = 0
) -> schema.Experiment:
    """The run's config: ``base`` (a config file's, or None: the defaults with a data section
    that names only the language pair) with the pretrained model's model and evaluation
    settings; ``added``: the number of tokens added to its vocabulary."""
    config = schema.plain(schema.complete(base if base is not None else schema.default_config()))
    model = {k: v for k, v in config['model'].items() if k in FREE_FIELDS}
    config['model'] = {**model, **pretrained.model}
    config['eval'].update(pretrained.eval)
    data = config['data']
    data['vocab_size'] = pretrained.tokenizer.vocab_size + added
    data.update(data_lib.special_fields(pretrained.tokenizer.special))  # recorded, not detected
    if base is None:
        source, target = pretrained.languages
        data.update(dataset='none', source_lang=source or 'src', target_lang=target or 'tgt')
    try:
        return schema.parse(config)
    except schema.ConfigError as e:
        raise PretrainedError(str(e)) from None


def check_fits(config: schema.Experiment, pretrained: Pretrained) -> Transformer:
    """The model of ``config``, after checking that the converted parameters are its tree
    (one subtree per layer, as the families read them: `convert` stacks them for
    ``model.scan_layers``)."""
    cfg = config_from_dict(config.model, config.data.vocab_size)
    per_layer = Transformer(dataclasses.replace(cfg, scan_layers=False))
    wanted = jax.tree.map(lambda x: tuple(x.shape), abstract_params(per_layer))
    found = jax.tree.map(lambda x: tuple(np.shape(x)), pretrained.params)
    if wanted != found:
        raise PretrainedError(
            f'The parameters read from {pretrained.directory} do not form the model its config '
            'describes; this is a bug of the converter, please report it.'
        )
    return Transformer(cfg)


def decoding_line(config: schema.Experiment, generation: dict[str, Any]) -> str:
    """One line: the decoding settings a conversion recorded (the run's ``eval``, and
    ``data.never_emit``) and where each came from (converted_from.json's ``generation``:
    `Pretrained.generation`)."""
    ev = config.eval
    beams, penalty, longest = (generation[k] for k in ('num_beams', 'length_penalty', 'max_length'))
    search = 'greedy' if ev.beam_size == 1 else f'beam {ev.beam_size}'
    forced, banned, renormalize = (
        generation[k] for k in ('forced_eos_token_id', 'bad_words_ids', 'renormalize_logits')
    )
    limit = {'forced': 'EOS forced', 'none': 'no EOS forced', 'scored': 'only EOS'}
    return (
        f'Decoding settings recorded: {search} (num_beams from {beams[1]}), length penalty '
        f"alpha {ev.alpha} '{ev.length_penalty}', log P / length^{ev.alpha} "
        f'(length_penalty from {penalty[1]}); outputs end at input length + '
        f'{ev.extra_length} tokens (eval.extra_length; max_length {longest[0]} from '
        f'{longest[1]} is not recorded), {limit[ev.eos_at_limit]} there '
        f"(eval.eos_at_limit '{ev.eos_at_limit}': forced_eos_token_id={forced[0]} from "
        f'{forced[1]}); never emitted: ids {config.data.never_emit} (data.never_emit: pad, '
        f'and bad_words_ids={banned[0]} from {banned[1]}); beam scores '
        f'{"" if ev.renormalize else "not "}renormalised after banning tokens '
        f'(eval.renormalize: renormalize_logits={renormalize[0]} from {renormalize[1]}).'
    )


def added_tokens(pretrained: Pretrained, spec: str | None) -> list[tuple[str, str | None]]:
    """The tokens ``--add_tokens`` (``spec``) adds to the pretrained vocabulary, checked
    (transformer/data/added_tokens.py); a one-line `PretrainedError` otherwise."""
    try:
        added = data_lib.added_tokens.parse(spec, '--add_tokens')
        data_lib.added_tokens.check(pretrained.tokenizer, added, '--add_tokens')
    except data_lib.DataError as e:
        raise PretrainedError(str(e)) from None
    return added


def check_pair(family: Any, pretrained: Pretrained, added: list, config: schema.Experiment) -> None:
    """A one-line `PretrainedError` unless the pair a config names (``data.source_lang_code``
    / ``data.target_lang_code``) is one of the run's vocabulary, its added codes included
    (`data.added_tokens`): the recorded pair is the one ``translate`` decodes without flags.
    The vocabulary with the added tokens is read from a temporary copy, as the run will."""
    data = config.data
    if not (data.source_lang_code or data.target_lang_code):
        return

    def check(tokenizer: Any) -> None:
        data_lib.language_pair.with_pair(
            tokenizer,
            data.source_lang_code,
            data.target_lang_code,
            vocabulary=f'the vocabulary of {pretrained.directory}',
        )

    try:
        if not added:
            check(pretrained.tokenizer)
            return
        with tempfile.TemporaryDirectory() as scratch:
            family.write_vocabulary(pretrained.tokenizer, added, scratch)
            check(family.load_vocabulary(scratch))
    except data_lib.DataError as e:
        raise PretrainedError(f'--config: {e}') from None


def _into_jax(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with each numpy leaf replaced, in place and one at a time, by a jax array, so
    each numpy copy can go as its array is made. Orbax saves jax arrays with about 0.6x the
    model beside them; numpy arrays it copies whole first, about 1.9x (a T5 of 270 MiB,
    benchmarks/convert_memory.py)."""
    host = jax.devices('cpu')[0]  # not an accelerator's memory: the arrays are only written
    for key, value in tree.items():
        # A copy jax owns: an array aliasing numpy's buffer (device_put's default on a CPU)
        # crashed a later test of the same process (a worker lost in 3 of 3 runs of the
        # convert tests together).
        tree[key] = (
            _into_jax(value)
            if isinstance(value, dict)
            else jax.device_put(value, host, may_alias=False)
        )
        del value
    return tree


def convert(
    from_hf: str, workdir: str, base: Any | None = None, add_tokens: str | None = None
) -> schema.Experiment:
    """Converts the pretrained directory ``from_hf`` into the run directory ``workdir``; returns
    the run's config. ``base``: the config giving the data and evaluation sections;
    ``add_tokens``: tokens to add to the vocabulary (transformer/data/added_tokens.py)."""
    start = time.perf_counter()
    workdir = os.path.abspath(workdir)
    if os.path.isfile(workdir) or (os.path.isdir(workdir) and os.listdir(workdir)):
        raise PretrainedError(
            f'{workdir} exists and is not empty: --workdir names a new directory.'
        )
    family = interop.family_of(from_hf)
    pretrained = family.load(from_hf)
    added = added_tokens(pretrained, add_tokens)
    likes = data_lib.added_tokens.like_rows(pretrained.tokenizer, added)
    pretrained.params = interop.add_rows(pretrained.params, likes)
    config = experiment_config(pretrained, base, len(added))
    check_fits(config, pretrained)
    check_pair(family, pretrained, added, config)
    parent = os.path.dirname(workdir)
    os.makedirs(parent, exist_ok=True)
    problem = files.unwritable(parent)
    if problem:
        raise PretrainedError(
            f'Cannot write into {parent} ({problem}); --workdir names another place.'
        )

    def build(scratch: str) -> str:
        run = os.path.join(scratch, 'run')
        os.mkdir(run)
        rundir.write_config(run, config)
        vocab = rundir.path(run, rundir.VOCAB_DIR)
        os.mkdir(vocab)
        if added:
            family.write_vocabulary(pretrained.tokenizer, added, vocab)
        else:
            pretrained.tokenizer.copy_to(vocab)
        origin = {'from_hf': os.path.abspath(pretrained.directory)}
        params = convert_layer_layout(pretrained.params, config.model.scan_layers)
        pretrained.params = None  # its numpy leaves go as each moves (`_into_jax`)
        save_params(run, config, 0, _into_jax(params), origin)
        with open(rundir.path(run, rundir.CONVERTED_FILE), 'w') as f:
            record = {rundir.FAMILY_KEY: family.name, 'generation': pretrained.generation}
            record[rundir.SOURCE_FILES] = pretrained.files
            record['add_tokens'] = add_tokens or None
            json.dump({**origin, **record}, f, indent=2)
        return run

    try:
        files.write_in_place(workdir, build)  # a new or empty directory only
    except files.NotReplaceable as e:  # something appeared there during the conversion
        raise PretrainedError(
            f'{e}: --workdir names a new directory; nothing was written.'
        ) from None
    logging.info(
        'Converted %s into %s in %.1f s.',
        *(pretrained.directory, workdir, time.perf_counter() - start),
    )
    return config


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.convert --from_hf DIR --workdir W [--config CONFIG]``."""
    import sys

    from absl import app, flags
    from ml_collections import config_flags

    define = console.define_flag
    define(
        'from_hf',
        flags.DEFINE_string,
        None,
        f'A local Hugging Face model directory: {interop.known()}.',
    )
    define('workdir', flags.DEFINE_string, None, 'The run directory to write (new or empty).')
    define(
        'add_tokens',
        flags.DEFINE_string,
        None,
        "Optional: tokens to add to the vocabulary, 'NAME[=LIKE],...' (docs/pretrained.md).",
    )
    define(
        'config',
        config_flags.DEFINE_config_file,
        None,
        'Optional: the config whose data and eval sections the run gets (e.g. multi30k), '
        'with --config.data.* overrides.',
        lock_config=True,
    )
    FLAGS = flags.FLAGS

    def main(_):
        console.require('from_hf', 'workdir')
        base = None
        if flags.FLAGS['config'].present:
            try:
                file = config_flags.get_config_filename(flags.FLAGS['config'])
                base = configs.checked(FLAGS.config, file)
            except (schema.ConfigError, ValueError) as e:
                console.usage_exit(str(e))
        try:
            config = convert(FLAGS.from_hf, FLAGS.workdir, base, FLAGS.add_tokens)
        except (PretrainedError, rundir.WorkdirError, OSError) as e:
            raise SystemExit(f'error: {e}') from None
        m = config.model
        print(
            f'Converted {FLAGS.from_hf} into {FLAGS.workdir}: {m.num_encoder_layers}+'
            f'{m.num_decoder_layers} layers, d_model {m.d_model}, vocabulary '
            f'{config.data.vocab_size}'
            + (f' ({FLAGS.add_tokens} added)' if FLAGS.add_tokens else '')
            + f', ffn {m.ffn!r}.'
        )
        with open(rundir.path(FLAGS.workdir, rundir.CONVERTED_FILE), encoding='utf-8') as f:
            print(decoding_line(config, json.load(f)['generation']))

    try:
        argv = console.resolve_config_arg(sys.argv if argv is None else argv)
    except app.UsageError as e:
        console.usage_exit(str(e))
    console.run(main, argv, explain_flag_error)


if __name__ == '__main__':
    cli()
