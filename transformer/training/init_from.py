"""Fine-tuning: a new run that starts from another model's parameters and vocabulary
(``train.init_from``) with a fresh optimizer and schedule, on the config's data.

``train.init_from`` names a pretrained model directory of a family this project reads (a
Hugging Face MarianMT: transformer/interop/), or one of this project's run directories (its latest
checkpoint, or ``RUN@STEP`` for that step). Every model field that changes the function comes
from there; the config may set only how the same function is computed (`model.HOW_FIELDS`,
the dtypes) and the dropout rates, and a command-line override of any other
model field stops the run in one line before its directory is written. The vocabulary is
copied into the new run directory, so the run, its resumes and every command that reads it
need nothing of the start afterwards; config.json records ``train.init_from``. A start that is
the work directory itself, and no start where the config requires one
(``train.init_from_required``), stop in one line (`check_start`).

``train.add_tokens`` adds tokens to a pretrained vocabulary (transformer/data/added_tokens.py):
the run's copy of the vocabulary holds them and its parameters get their rows, so resumes,
averages and exports keep them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
from collections.abc import Collection
from typing import Any

import jax
import numpy as np
from absl import logging

from transformer import data as data_lib
from transformer import interop, rundir, schema
from transformer.checkpoint import load_model
from transformer.model import DTYPE_FIELDS, HOW_FIELDS, STACKED_KEYS, convert_layer_layout
from transformer.training import steps
from transformer.training.stops import TrainingError

PyTree = Any

# The model fields a fine-tuning config may set: how the function is computed, and dropout.
FREE_MODEL_FIELDS = (
    *HOW_FIELDS,
    *DTYPE_FIELDS,
    *('dropout_rate', 'attention_dropout_rate', 'relu_dropout_rate', 'token_dropout_rate'),
)


@dataclasses.dataclass
class Start:
    """What a fine-tuning run starts from."""

    path: str  # the pretrained or run directory
    step: int | None  # the run directory's checkpoint (None: a pretrained directory)
    model: dict[str, Any]  # its model section, as config.json holds it
    tokenizer: Any  # its vocabulary: a family's (`interop.Family.load_vocabulary`) or a Tokenizer
    family: interop.Family | None = None  # the pretrained directory's family (None: a run)
    added: list = dataclasses.field(default_factory=list)  # train.add_tokens, parsed


def parse(init_from: str) -> tuple[str, int | None]:
    """``PATH`` or ``PATH@STEP`` -> (PATH, STEP or None)."""
    path, at, step = init_from.rpartition('@')
    if at and step.isdigit() and not os.path.exists(init_from):
        return path, int(step)
    return init_from, None


def read_start(init_from: str) -> Start:
    """The model, vocabulary and checkpoint ``train.init_from`` names (parameters not yet
    read); one-line `TrainingError` for a path that is neither kind."""
    path, step = parse(init_from)
    key = f'train.init_from={init_from}'
    if not os.path.isdir(path):
        raise TrainingError(
            f'{key}: {path} is not a directory (a pretrained model directory or a run '
            'directory, optionally RUN@STEP).'
        )
    try:
        family = interop.recognised(path)
        if family is not None:
            if step is not None:
                raise TrainingError(
                    f'{key}: a {family.title} directory has no steps; drop @{step}.'
                )
            pretrained = family.load(path, weights=False)
            return Start(path, None, dict(pretrained.model), pretrained.tokenizer, family)
        if not os.path.isfile(rundir.path(path, rundir.CONFIG_FILE)):
            raise TrainingError(
                f'{key}: {path} is neither a pretrained model directory ({interop.known()}) '
                'nor a run directory.'
            )
        config = rundir.read_config(path)
        model = schema.to_dict(config)['model']
        return Start(path, step, model, rundir.load_tokenizer(config, path))
    except (rundir.WorkdirError, interop.PretrainedError) as e:
        raise TrainingError(f'{key}: {e}') from None


def check_start(train: schema.TrainSection, workdir: str) -> None:
    """A one-line `TrainingError` for a recipe that needs ``train.init_from`` and names none
    (``train.init_from_required``), or for one that names ``workdir`` itself: the run would
    write its files into the model it starts from."""
    if train.init_from_required and not train.init_from:
        raise TrainingError(
            'This config fine-tunes a pretrained model (train.init_from_required) and names '
            'none: give --config.train.init_from=PATH, a pretrained or run directory (RUN@STEP: '
            'that step).'
        )
    if train.init_from and os.path.realpath(parse(train.init_from)[0]) == os.path.realpath(workdir):
        raise TrainingError(
            f'train.init_from={train.init_from} is the --workdir itself: a run writes its own '
            'files into its work directory; fine-tune into a new --workdir.'
        )


def apply(
    config: schema.Experiment, workdir: str, overridden: Collection[str] = ()
) -> tuple[schema.Experiment, Start | None]:
    """``config`` with the model of the run it fine-tunes, and that start (None: the config
    starts from nothing). A run that has checkpoints keeps the model its config.json holds.

    ``overridden``: the config keys set on the command line ('model.d_model', ...); one that
    changes a model field other than `FREE_MODEL_FIELDS` raises a one-line `TrainingError`.
    """
    check_start(config.train, workdir)
    init_from = config.train.init_from
    if not init_from:
        return config, None
    start = read_start(init_from)
    start.added = _added(start, config.train.add_tokens)
    values = schema.to_dict(config)
    model = start.model
    if rundir.has_checkpoints(workdir) and os.path.isfile(rundir.path(workdir, 'config.json')):
        saved = rundir.read_config(workdir)
        model = schema.to_dict(saved)['model']
        if saved.train.add_tokens != config.train.add_tokens:
            raise TrainingError(
                f'{workdir} holds a run trained with train.add_tokens='
                f'{saved.train.add_tokens!r}, not {config.train.add_tokens!r}: a run keeps its '
                'vocabulary. Resume with its settings, or use a new --workdir.'
            )
    for key in overridden:
        section, _, name = key.partition('.')
        if section != 'model' or name in FREE_MODEL_FIELDS:
            continue
        if values['model'].get(name) != model.get(name):
            raise TrainingError(
                f'--config.{key}={values["model"].get(name)!r} changes the model that '
                f'train.init_from={init_from} gives ({name}={model.get(name)!r}): a fine-tuned '
                'model keeps its own; only how it is computed and its dropout may be set ('
                + ', '.join(FREE_MODEL_FIELDS)
                + ').'
            )
    free = {k: v for k, v in values['model'].items() if k in FREE_MODEL_FIELDS}
    values['model'] = {**model, **free}
    values['data']['vocab_size'] = start.tokenizer.vocab_size + len(start.added)
    values['data'].update(data_lib.special_fields(start.tokenizer.special))
    why = getattr(start.tokenizer, 'no_label_smoothing', None)
    if why and config.train.label_smoothing > 0:
        raise TrainingError(
            f'train.label_smoothing={config.train.label_smoothing} with '
            f'train.init_from={init_from}: {why}'
        )
    try:
        return schema.parse(schema.complete(values)), start
    except schema.ConfigError as e:
        raise TrainingError(f'train.init_from={init_from}: {e}') from None


def _added(start: Start, spec: str | None) -> list[tuple[str, str | None]]:
    """``train.add_tokens`` (``spec``) parsed and checked against the start's vocabulary."""
    key = f'train.add_tokens={spec!r}'
    if spec and interop.vocabulary_family(start.tokenizer) is None:
        raise TrainingError(
            f'{key}: train.init_from={start.path} has a SentencePiece vocabulary of this '
            "project, which cannot grow; tokens are added to a pretrained model's vocabulary "
            'only.'
        )
    try:
        added = data_lib.added_tokens.parse(spec)
        data_lib.added_tokens.check(start.tokenizer, added, key)
    except data_lib.DataError as e:
        raise TrainingError(str(e)) from None
    return added


def run_vocabulary(start: Start) -> Any:
    """The vocabulary a run started from ``start`` trains with: the start's, with the tokens of
    ``train.add_tokens`` (``start.added``) added, built in a temporary directory so that the
    checks before the first write see it (`copy_vocabulary` writes the run's copy)."""
    if not start.added:
        return start.tokenizer
    family = interop.vocabulary_family(start.tokenizer)
    with tempfile.TemporaryDirectory() as directory:
        family.write_vocabulary(start.tokenizer, start.added, directory)
        never_emit = start.tokenizer.special.never_emit  # (its model's banned words)
        return family.load_vocabulary(directory, never_emit=never_emit)  # (read whole)


def copy_vocabulary(start: Start | None, config: schema.Experiment, workdir: str) -> None:
    """Puts the start's vocabulary where the run keeps its own (kept if already there;
    nothing without a start)."""
    if start is None:
        return
    family = interop.vocabulary_family(start.tokenizer)
    if family is not None:
        directory = rundir.path(workdir, rundir.VOCAB_DIR)
        if start.added and family.holds_vocabulary(directory):
            return  # a resume: the run's copy holds the added tokens already
        os.makedirs(directory, exist_ok=True)
        if start.added:
            family.write_vocabulary(start.tokenizer, start.added, directory)
        else:
            start.tokenizer.copy_to(directory)
        return
    target = rundir.vocab_path(config, workdir)
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(start.tokenizer.model_path, target)


def start_params(start: Start, abstract: PyTree) -> PyTree:
    """The start's parameters, placed as ``abstract`` (shapes, dtypes, global shardings of the
    new run's parameters) says; a tree that differs raises a one-line `TrainingError`."""
    where = f'train.init_from={start.path}'
    try:
        scanned = STACKED_KEYS[0] in abstract  # the new run's layout of the layers
        if start.family is not None:
            params = convert_layer_layout(start.family.load(start.path).params, scanned)
        else:
            params = load_model(start.path, step=start.step, average_last=1, scan_layers=scanned)[3]
    except (rundir.WorkdirError, interop.PretrainedError) as e:
        raise TrainingError(f'{where}: {e}') from None
    likes = data_lib.added_tokens.like_rows(start.tokenizer, start.added)
    params = interop.add_rows(params, likes)
    leaves = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    wanted = {
        jax.tree_util.keystr(p): tuple(x.shape)
        for p, x in jax.tree_util.tree_leaves_with_path(abstract)
    }
    if {k: tuple(np.shape(x)) for k, x in leaves.items()} != wanted:
        raise TrainingError(f'{where}: its parameters do not fit the model of its config.')

    def place(path, target):
        value = np.asarray(leaves[jax.tree_util.keystr(path)], target.dtype)
        return jax.make_array_from_callback(target.shape, target.sharding, lambda i: value[i])

    return jax.tree_util.tree_map_with_path(place, abstract)


def init_state(start: Start | None, parallel: Any, init: Any, tx: Any) -> Any:
    """A new run's train state in ``parallel``'s layout: ``init()``'s (random parameters, a
    fresh optimizer), or, when it fine-tunes, the start's parameters with a fresh state of
    ``tx`` (the optimizer) for them: no random parameters are drawn (nor their program
    compiled), so the model is never held twice."""
    if start is None:
        return parallel.init_state(init)
    params = start_params(start, parallel.abstract_state(init).params)
    logging.info('Starting from the parameters of %s.', start.path)
    return parallel.init_state(functools.partial(steps.fresh_state, tx), params)
