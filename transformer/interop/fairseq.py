"""fairseq's translation families as Hugging Face serves them: M2M100 (``model_type``
'm2m_100': M2M100 418M and 1.2B, and NLLB-200's dense models, whose config.json names
M2M100ForConditionalGeneration) and mBART (``model_type`` 'mbart': mBART-50). `read` takes a
directory: config.json into the ``model`` section (fairseq_config.py, with its refusals), the
generation settings ``generate`` applies into the ``eval`` section (`eval_settings`), the
tensors into the parameter tree (fairseq_params.py); fairseq_export.py writes them back.
Every problem is one `FairseqError` naming the file and key, raised before anything is
written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from transformer.fields import ConfigError
from transformer.interop import generation as generation_lib
from transformer.interop.fairseq_config import (
    FAIRSEQ_IDS,
    SPECS,
    FamilySpec,
    check_special_ids,
    config_value,
    model_settings,
)
from transformer.interop.fairseq_params import FairseqError, params_from_state_dict
from transformer.interop.generation import CONFIG_FILE, GENERATION_FILE, HF_DEFAULT
from transformer.interop.state_dict import read_state_dict
from transformer.model import TransformerConfig, config_from_dict
from transformer.tokens import SpecialIds

# generate's settings these families' files name beside Hugging Face's defaults
# (generation.HF_DEFAULTS): the first token forced (the target-language code), and three this
# project does not copy (`eval_settings` says what becomes of each).
GENERATION_DEFAULTS = {
    **generation_lib.HF_DEFAULTS,
    'forced_bos_token_id': None,
    'early_stopping': None,
    'no_repeat_ngram_size': None,
    'min_length': None,
}


def generation_settings(
    generation: dict[str, Any] | None, hf: dict[str, Any], spec: FamilySpec
) -> generation_lib.Settings:
    """`generation.generation_settings` of `GENERATION_DEFAULTS`' keys; without
    generation_config.json, a key config.json leaves out is its config class's default where
    the class has one (mBART's forced_eos_token_id 2), as transformers builds the generation
    config from the config object."""
    settings = generation_lib.generation_settings(generation, hf, GENERATION_DEFAULTS)
    if generation is None:
        for key, (_, where) in settings.items():
            if where == HF_DEFAULT and spec.defaults.get(key) is not None:
                settings[key] = (spec.defaults[key], f"{spec.title}'s config default")
    return settings


def eval_settings(generation: generation_lib.Settings, directory: str) -> dict[str, Any]:
    """The ``eval`` settings of `generation_settings` (`generation.eval_settings`: the beam
    size, the length penalty with Hugging Face's rule, EOS at the limit; the absolute
    max_length not copied). ``early_stopping`` is ignored: the beam search here ends an
    example when no live hypothesis can still win (docs/pretrained.md). ``forced_bos_token_id``
    (the target-language code) is not an eval setting: `read` gives it to the caller.

    Raises:
      FairseqError: ``no_repeat_ngram_size`` or ``min_length`` above 0 (the run cannot record
        them: evaluate's and translate's --no_repeat_ngram and --min_length take them).
    """
    for key, flag in (('no_repeat_ngram_size', 'no_repeat_ngram'), ('min_length', 'min_length')):
        value, where = generation[key]
        if value not in (None, 0):
            raise FairseqError(
                f'{os.path.join(directory, where)}: {key}={value!r} is not recorded by a run: '
                f'set it to 0 and pass --{flag} {value} to evaluate and translate instead.'
            )
    return generation_lib.eval_settings(generation, directory, FairseqError)


def _read_json(directory: str, name: str) -> dict[str, Any]:
    file = os.path.join(directory, name)
    try:
        with open(file, encoding='utf-8') as f:
            value = json.load(f)
    except OSError as e:
        raise FairseqError(f'{file} cannot be read ({e.strerror}).') from None
    except ValueError as e:
        raise FairseqError(f'{file} is not valid JSON ({e}).') from None
    if not isinstance(value, dict):
        raise FairseqError(f'{file} holds {type(value).__name__}, not a JSON object.')
    return value


def recognises(path: str) -> bool:
    """Whether ``path`` looks like an M2M100/NLLB-200 or mBART directory (a config.json of
    one of their model types, and no run directory's checkpoints); never raises."""
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config) or os.path.isdir(os.path.join(path, 'checkpoints')):
        return False
    try:
        with open(config, encoding='utf-8') as f:
            return json.load(f).get('model_type') in SPECS
    except (OSError, ValueError, AttributeError):
        return False


@dataclasses.dataclass
class FairseqModel:
    """An M2M100/NLLB-200 or mBART directory read into this project's terms (its vocabulary
    is read apart: fairseq_vocab.py)."""

    family: str  # `FamilySpec.name`: 'm2m100' or 'mbart'
    directory: str
    model: dict[str, Any]  # the config's model section
    vocab_size: int  # the embedding's rows (config.json's vocab_size), every one kept
    special: SpecialIds  # fairseq's ids, with the ids bad_words_ids bans never emitted
    eval: dict[str, Any]  # the eval settings its own generation applies
    generation: generation_lib.Settings  # each generation setting: value, where it came from
    # generate's forced_bos_token_id: the target-language code it forces first, or None.
    forced_bos: int | None
    params: dict[str, Any] | None  # None until read with weights=True
    # Its config files as read ({name: JSON object, or None without that file}): its export
    # writes their values back.
    files: dict[str, dict[str, Any] | None]

    def config(self) -> TransformerConfig:
        """The model's `TransformerConfig`."""
        return config_from_dict(self.model, self.vocab_size, self.special)


def _forced_bos(generation: generation_lib.Settings, size: int, directory: str) -> int | None:
    value, where = generation['forced_bos_token_id']
    if value is not None and (type(value) is not int or not 0 <= value < size):
        raise FairseqError(
            f'{os.path.join(directory, where)}: forced_bos_token_id={value!r} is not an id '
            f'below vocab_size={size}.'
        )
    return value


def _check_start(keys: dict[str, Any], file: str) -> None:
    """A `FairseqError` where the generation config ``generate`` reads (``keys``, from
    ``file``) names no decoder start: it would start from bos_token_id, these models from
    </s>."""
    if keys.get('decoder_start_token_id') is None:
        raise FairseqError(
            f'{file}: decoder_start_token_id is not set, so generate would start from '
            f'bos_token_id; set it to {FAIRSEQ_IDS.decoder_start} (</s>), where these models '
            'start.'
        )


def read(directory: str, weights: bool = True) -> FairseqModel:
    """Reads an M2M100/NLLB-200 or mBART directory: its config (checked first), generation
    settings and (``weights``) tensors: model.safetensors, pytorch_model.bin or their shards
    (transformer/interop/state_dict.py). Nothing is downloaded; every problem is one
    `FairseqError`, raised before anything is written."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FairseqError(
            f'{directory} is not a directory: name a local M2M100, NLLB-200 or mBART '
            "directory (download one with the hub's own tool first)."
        )
    file = os.path.join(directory, CONFIG_FILE)
    hf = _read_json(directory, CONFIG_FILE)
    model = model_settings(hf, file)
    spec = SPECS[hf['model_type']]
    check_special_ids({**spec.defaults, **hf}, file)
    has_generation = os.path.isfile(os.path.join(directory, GENERATION_FILE))
    generation_file = _read_json(directory, GENERATION_FILE) if has_generation else None
    keys, name = (
        (hf, CONFIG_FILE) if generation_file is None else (generation_file, GENERATION_FILE)
    )
    keys_file = os.path.join(directory, name)
    if generation_file is not None:
        check_special_ids(generation_file, keys_file)
    _check_start({**spec.defaults, **hf} if generation_file is None else generation_file, keys_file)
    generation = generation_settings(generation_file, hf, spec)
    settings = eval_settings(generation, directory)
    size = config_value(hf, spec, 'vocab_size')
    banned = generation_lib.single_token_bans(keys, size, FAIRSEQ_IDS.eos, keys_file, FairseqError)
    special = dataclasses.replace(FAIRSEQ_IDS, never_emit=(*FAIRSEQ_IDS.never_emit, *banned))
    forced_bos = _forced_bos(generation, size, directory)
    files = {CONFIG_FILE: hf, GENERATION_FILE: generation_file}
    read = FairseqModel(
        spec.name, directory, model, size, special, settings, generation, forced_bos, None, files
    )
    try:
        cfg = read.config()  # the model section's own rules, checked before the weights
    except ConfigError as e:
        raise FairseqError(f'{file}: {e}') from None
    if weights:
        state = read_state_dict(directory, spec.title, FairseqError)
        read.params = params_from_state_dict(state, cfg, directory)
    return read
