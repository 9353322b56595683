"""What a later start of a run may change of its config, and the record it keeps of the
changes: config.json holds the settings a run started with, config_history.jsonl each setting a
resume changed (transformer/rundir.py names both files and reads them back)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from transformer import data as data_lib
from transformer import multihost, rundir, schema
from transformer.model import HOW_FIELDS

Config = schema.Config

# Settings a resumed run may change in its model or data section: paths to the same files,
# and how the same model is computed (model.HOW_FIELDS: the attention, the embedding gradient,
# what the backward pass recomputes, the layers' layout).
RESUME_FREE = (
    *('data.manual_dir', 'data.data_dir', 'data.cache_dir', 'data.folder'),
    *(f'model.{name}' for name in HOW_FIELDS),
)
# How one process joins a multi-host run: differs between processes, never recorded.
LAUNCH_SETTINGS = (
    *('train.distributed', 'train.coordinator_address', 'train.num_processes'),
    *('train.process_id', 'train.init_timeout_s'),
)


def flat_config(config: Config) -> dict[str, Any]:
    """Dotted key -> value as JSON holds it (so a fresh config compares with a saved one)."""

    def walk(node: Mapping[str, Any], prefix: str):
        for key, value in node.items():
            if isinstance(value, Mapping):
                yield from walk(value, f'{prefix}{key}.')
            else:
                yield f'{prefix}{key}', value

    return dict(walk(rundir.plain_values(config), ''))


def resume_changes(workdir: str, config: Config) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for each setting ``config`` changes in a run that has checkpoints.

    Raises:
      WorkdirError: a change of the model or the data (what the checkpoints and the
        vocabulary were made with), named in one line. Paths to the same files and how the
        same model is computed (`RESUME_FREE`: attention, embedding gradient, remat, the
        layers' layout) may change. Also a missing config.json or
        vocabulary: training would write new ones that do not fit the checkpoints.
    """
    for needed, what in (
        (rundir.path(workdir, rundir.CONFIG_FILE), 'the settings they were trained with'),
        (
            rundir.pretrained_vocab_dir(config, workdir) or rundir.vocab_path(config, workdir),
            'the vocabulary they were trained with',
        ),
    ):
        if not os.path.exists(needed):
            raise rundir.WorkdirError(
                f'{workdir} holds checkpoints but no {needed}, {what}: restore it to resume, '
                'or train in a new --workdir.'
            )
    saved, new = flat_config(rundir.read_config(workdir)), flat_config(config)
    changes = [
        (key, saved[key], new[key])
        for key in sorted(saved.keys() & new.keys())
        if saved[key] != new[key] and key not in LAUNCH_SETTINGS
    ]
    for key, old, value in changes:
        if key == 'data.mix' and data_lib.mix_entries.same_but_folders(old, value):
            continue  # a mix whose folders moved, as data.folder may
        if key in schema.PATH_KEYS and schema.same_path(old, value):
            continue  # a path stored as it was typed, now absolute
        if key.split('.')[0] in ('model', 'data') and key not in RESUME_FREE:
            raise rundir.WorkdirError(
                f'{workdir} holds a run trained with {key}={old!r}, not {value!r}: a run keeps '
                'its model and data. Resume with its settings, or use a new --workdir.'
            )
    return changes


def keep_record(
    workdir: str, config: Config, step: int | None, changes: Sequence[tuple[str, Any, Any]]
) -> None:
    """config.json describes what the run started with: written when it starts (``step``
    None: nothing restored); a resume at ``step`` adds the settings it changes (`resume_changes`),
    one line each on the console and in config_history.jsonl. Process 0 writes."""
    if step is None:
        if multihost.is_main():
            rundir.write_config(workdir, config)
        return
    for key, old, new in changes:
        logging.info('Resuming at step %d with %s=%r (was %r).', step, key, new, old)
    if changes and multihost.is_main():
        with open(rundir.path(workdir, rundir.HISTORY_FILE), 'a') as f:
            for key, old, new in changes:
                f.write(json.dumps({'step': step, 'key': key, 'old': old, 'new': new}) + '\n')
