"""The settings that name a file or a directory, and how a run keeps them: absolute, resolved
against the directory the command was given in, so that a command run later from elsewhere
(evaluate, translate, a resume) finds the same files."""

from __future__ import annotations

import os
from typing import Any

from transformer.data import mix_entries
from transformer.schema.convert import parse, to_dict
from transformer.schema.sections import Experiment

# The settings that name a file or a directory; data.mix names folders among its entries.
PATH_KEYS = (
    *('data.folder', 'data.manual_dir', 'data.data_dir', 'data.cache_dir', 'data.vocab_path'),
    'train.init_from',
)


def absolute(path: str) -> str:
    """``path`` resolved against the current directory (``~`` expanded); a URL (``gs://``)
    as it is."""
    return path if '://' in path else os.path.abspath(os.path.expanduser(path))


def absolute_paths(experiment: Experiment) -> Experiment:
    """``experiment`` with every path of `PATH_KEYS` and of data.mix's folder entries
    absolute (`absolute`); ``experiment`` itself when they all are."""
    values = to_dict(experiment)
    changed = False
    for key in PATH_KEYS:
        section, name = key.split('.')
        value = values[section].get(name)
        if value and absolute(value) != value:
            values[section][name], changed = absolute(value), True
    mix = values['data'].get('mix')
    if mix and mix_entries.absolute_folders(mix) != mix:
        values['data']['mix'], changed = mix_entries.absolute_folders(mix), True
    return parse(values) if changed else experiment


def same_path(old: Any, new: Any) -> bool:
    """Whether two values of a path setting name the same place (a relative one as seen from
    the current directory): a run directory written before paths were stored absolute."""
    if not (isinstance(old, str) and isinstance(new, str) and old and new):
        return old == new
    return absolute(old) == absolute(new)


def split_paths(data: Any) -> list[str]:
    """The path settings a split of ``data.dataset`` is read from (those set): the folder of
    a folder dataset, Multi30k's raw files (a TFDS dataset's manual download is read once,
    into its prepared copy)."""
    keys = {'folder': ['data.folder'], 'multi30k': ['data.manual_dir']}.get(data.dataset, [])
    return [key for key in keys if getattr(data, key.split('.')[1], None)]
