"""The registry of pretrained families: which family reads a directory (`family_of`), which
one a name or a vocabulary belongs to, and which one a run exports as (`export_family`).

A family is one `Family` value (family.py) in `FAMILIES`; the callers (convert,
``train.init_from``, export, the CTranslate2 writer, the run directory's vocabulary, the work
directory checks) ask this module and never name one.
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformer.interop import fairseq_family, marian, t5
from transformer.interop.family import Family, PretrainedError

FAMILIES: tuple[Family, ...] = (
    marian.FAMILY,
    fairseq_family.M2M100,
    fairseq_family.MBART,
    t5.FAMILY,
)
# The family whose format a run trained here exports as (``export --format hf``).
DEFAULT_FAMILY = 'marian'
# The family of a run converted before converted_from.json named one: MarianMT was the only.
UNRECORDED_FAMILY = 'marian'
CONFIG_FILE = 'config.json'


def known() -> str:
    """The families, for messages: "marian (model_type 'marian')"."""
    return ', '.join(
        f'{f.name} (model_type {" or ".join(repr(t) for t in f.model_types)})' for f in FAMILIES
    )


def recognised(directory: str) -> Family | None:
    """The family that recognises ``directory`` as one of its own, or None."""
    return next((f for f in FAMILIES if f.recognises(directory)), None)


def _what_it_holds(directory: str) -> str:
    """What ``directory``'s config.json says of its kind, for the message of `family_of`."""
    file = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(file):
        return f'no {CONFIG_FILE}'
    try:
        with open(file, encoding='utf-8') as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        return f'{CONFIG_FILE} does not read as JSON: {str(e).splitlines()[0][:80]}'
    if not isinstance(config, dict) or config.get('model_type') is None:
        return f'{CONFIG_FILE} names no model_type'
    if os.path.isdir(os.path.join(directory, 'checkpoints')):
        return f'{CONFIG_FILE} has model_type={config["model_type"]!r}, beside checkpoints'
    return f'{CONFIG_FILE} has model_type={config["model_type"]!r}'


def family_of(directory: str) -> Family:
    """The family that reads ``directory``.

    Raises:
      PretrainedError: ``directory`` is not a directory, or no family recognises it; one line
        naming what its config.json says and the families this project knows.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise PretrainedError(
            f'{directory} is not a directory: name a local pretrained model directory '
            "(download one with the hub's own tool first)."
        )
    family = recognised(directory)
    if family is None:
        raise PretrainedError(
            f'{directory} is not a pretrained model directory this project reads '
            f'({_what_it_holds(directory)}); known families: {known()}.'
        )
    return family


def family_named(name: str) -> Family:
    """The family called ``name`` (converted_from.json's ``family``); a one-line
    `PretrainedError` for a name no family has."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise PretrainedError(f'{name!r} is not a pretrained family this project knows: {known()}.')


def vocabulary_family(vocabulary: Any) -> Family | None:
    """The family whose vocabulary ``vocabulary`` is (None: this project's joint SentencePiece
    tokenizer)."""
    return next((f for f in FAMILIES if f.owns_vocabulary(vocabulary)), None)


def held_vocabulary(directory: str) -> Family | None:
    """The family whose vocabulary the directory ``directory`` holds (a run's ``vocab/``),
    or None."""
    return next((f for f in FAMILIES if f.holds_vocabulary(directory)), None)


def export_family(recorded: str | None, vocabulary: Family | None) -> Family:
    """The family a run exports as with ``--format hf``: the one it was converted from
    (``recorded``, converted_from.json's), else the one whose vocabulary it holds
    (``vocabulary``: a run fine-tuned from a pretrained model), else `DEFAULT_FAMILY` (a run
    trained here)."""
    if recorded is not None:
        return family_named(recorded)
    return vocabulary or family_named(DEFAULT_FAMILY)
