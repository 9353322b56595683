"""What train and prepare check before they write anything into their work directory (before
it is made, its lock taken, a vocabulary copied or trained): that ``--workdir`` is new, empty
or a run's own; what ``train.init_from`` names (transformer/training/init_from.py); that a
run which holds a vocabulary already is given the settings it was made with; that every tag
of ``data.mix`` is a token of the vocabulary the run will have, and every language code of the
run and of its mix one of that vocabulary's codes. The config's paths are made absolute first
(`schema.absolute_paths`), as config.json stores them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection
from typing import Any

from transformer import data as data_lib
from transformer import interop, run_changes, rundir, schema
from transformer.training import init_from
from transformer.training.stops import TrainingError

# The settings a run's own vocabulary is made from (with the text of data.dataset's training
# split): a run that holds one keeps them, as a resume keeps its data
# (`run_changes.resume_changes`).
VOCAB_KEYS = (
    *('data.dataset', 'data.source_lang', 'data.target_lang', 'data.train_split'),
    *('data.vocab_size', 'data.vocab_model_type', 'data.vocab_normalization'),
    *('data.vocab_sample_size', 'data.pretokenize'),
)


@dataclasses.dataclass
class Checked:
    """A config that passed `before_writing`, and what the checks found."""

    config: schema.Experiment  # paths absolute; a fine-tuning run's with its start's model
    start: init_from.Start | None  # what ``train.init_from`` names
    changes: list[tuple[str, Any, Any]]  # settings a resume changes (`run_changes.resume_changes`)


def before_writing(
    config: schema.Experiment, workdir: str, overridden: Collection[str] = ()
) -> Checked:
    """Everything train and prepare can check of ``config`` and ``workdir`` before they write.

    Raises:
      TrainingError, rundir.WorkdirError, data.DataError: one line naming what to change.
    """
    config = schema.absolute_paths(config)
    check_workdir(workdir, config)
    config, start = init_from.apply(config, workdir, overridden)
    changes = run_changes.resume_changes(workdir, config) if rundir.has_checkpoints(workdir) else []
    vocabulary = held_vocabulary(config, workdir, start)  # (None: a new one, made later)
    data_lib.check_mix_vocabulary(config.data, vocabulary)  # tags and language codes
    # The special ids the run records are its vocabulary's (a new one: a joint SentencePiece).
    theirs = vocabulary.special if vocabulary is not None else data_lib.JOINT
    data_lib.check_special(theirs, config.data.special, 'The vocabulary of the run')
    return Checked(config, start, changes)


def check_workdir(workdir: str, config: schema.Experiment | None = None) -> None:
    """A one-line `TrainingError` unless ``workdir`` is missing, empty, a run's (its
    config.json says so) or holds only what a run writes (`rundir.RUN_ENTRIES`, the paths of
    ``config`` that lie in it, names starting with '.'). A converted model and a pretrained
    one (a Hugging Face config.json, weight or vocabulary files) are named as such, with how
    to fine-tune them. Its paths of the wrong kind first (`rundir.check_kinds`)."""
    rundir.check_kinds(workdir)
    if not os.path.isdir(workdir):
        return  # made by `rundir.create`
    fine_tune = f'fine-tune it with --config.train.init_from={workdir} and a new --workdir'
    if rundir.is_converted(workdir):
        raise TrainingError(
            f'{workdir} is a converted model (transformer.convert: parameters, no optimizer '
            f'state), not a run: {fine_tune}.'
        )
    found = _config_json(rundir.path(workdir, rundir.CONFIG_FILE))
    model_type = found.get('model_type') if isinstance(found, dict) else None
    if interop.recognised(workdir) or model_type is not None:  # (a family's, or another's)
        raise TrainingError(
            f'{workdir} holds a Hugging Face model (model_type {model_type!r}), not a '
            f'run: {fine_tune}.'
        )
    own = {*rundir.RUN_ENTRIES, *(_lying_in(workdir, config) if config else ())}
    foreign = sorted(n for n in os.listdir(workdir) if n not in own and not n.startswith('.'))
    model = [name for name in foreign if rundir.is_model_file(name)]
    named = ', '.join((model or foreign)[:3]) + (', ...' if len(model or foreign) > 3 else '')
    if model:
        raise TrainingError(
            f"{workdir} holds a pretrained model's files ({named}), not a run: {fine_tune}."
        )
    # A run's config.json, or its checkpoints (a run whose config.json is gone, which a
    # later check names): what else it holds is its user's.
    if foreign and found is None and not rundir.has_checkpoints(workdir):
        raise TrainingError(
            f'{workdir} holds files that no run writes ({named}): train in a new or empty '
            '--workdir (a model to start from goes in --config.train.init_from).'
        )


def _config_json(file: str) -> Any:
    """What a config.json holds (None: no such file; ``...``: one that is not JSON, whose
    damage `rundir.read_config` names)."""
    try:
        with open(file, encoding='utf-8') as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return ...


def _lying_in(workdir: str, config: schema.Experiment) -> set[str]:
    """The names in ``workdir`` that paths of ``config`` lie in (a ``data.cache_dir`` kept
    inside the run directory)."""
    root, values, names = os.path.realpath(workdir), run_changes.flat_config(config), set()
    for key in schema.PATH_KEYS:
        if values.get(key) and '://' not in values[key]:
            inner = os.path.relpath(os.path.realpath(schema.absolute(values[key])), root)
            if inner != '.' and not inner.startswith('..'):
                names.add(inner.split(os.sep)[0])
    return names


def held_vocabulary(config: schema.Experiment, workdir: str, start: init_from.Start | None):
    """The vocabulary the run will train with, where it exists already (None: a new one will
    be trained): the start's, a given ``data.vocab_path``, or the run's own, checked against
    the config.

    Raises:
      TrainingError: the run holds another vocabulary than its start's, or its own was made
        with other `VOCAB_KEYS` settings (as config.json says) or of another size.
    """
    held = rundir.pretrained_vocab_dir(config, workdir) or rundir.vocab_path(config, workdir)
    exists = os.path.exists(held)
    if start is not None:
        wanted = init_from.run_vocabulary(start)  # (with train.add_tokens)
        if exists and rundir.load_tokenizer(config, workdir).fingerprint != wanted.fingerprint:
            raise TrainingError(
                f'{workdir} holds a vocabulary ({held}) that is not the one of '
                f'train.init_from={start.path}: fine-tune in a new --workdir.'
            )
        return wanted
    if config.data.vocab_path:
        return data_lib.get_tokenizer(config.data, held)  # (one line if it is no vocabulary)
    if not exists:
        return None
    _check_made_with(config, workdir)
    vocabulary = rundir.load_tokenizer(config, workdir)
    size, asked = vocabulary.vocab_size, config.data.vocab_size
    # Fewer pieces than asked can be the text's limit; a start's vocabulary has its own size.
    pretrained = interop.vocabulary_family(vocabulary) is not None
    if size > asked or (pretrained and size != asked):
        _refuse(workdir, 'data.vocab_size', size, asked)
    return vocabulary


def _check_made_with(config: schema.Experiment, workdir: str) -> None:
    """The `VOCAB_KEYS` of ``config`` against those of the run's config.json (if any)."""
    if not os.path.isfile(rundir.path(workdir, rundir.CONFIG_FILE)):
        return
    saved, new = (
        run_changes.flat_config(rundir.read_config(workdir)),
        run_changes.flat_config(config),
    )
    for key in VOCAB_KEYS:
        if saved.get(key) != new.get(key):
            _refuse(workdir, key, saved.get(key), new.get(key))


def _refuse(workdir: str, key: str, held: Any, asked: Any) -> None:
    raise TrainingError(
        f'{workdir} holds a vocabulary made with {key}={held!r}, not {asked!r}: a run keeps '
        "its vocabulary. Give the run's own setting, or use a new --workdir."
    )
