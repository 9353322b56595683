"""The run directory: the one place that knows what a workdir holds and how to read it.

    WORKDIR/config.json          the experiment config (written once it fits the checkpoints)
    WORKDIR/vocab/spm.model      the joint SentencePiece vocabulary
    WORKDIR/data_cache/          token ids of each split (see transformer/data/tokenized.py)
    WORKDIR/checkpoints/<step>/  Orbax: params, opt_state, meta (step, seed, data position,
                                 the best validation score so far and the patience count)
    WORKDIR/best/<step>/         Orbax: params and meta of the best validation BLEU so far
    WORKDIR/metrics.jsonl        every logged metric; WORKDIR/tensorboard/ the same as events
    WORKDIR/eval/                hypotheses and scores written by ``transformer.evaluate``
    WORKDIR/train.lock           held while a process trains here (transformer/lock.py)

Every path inside a run directory is named here and nowhere else. Checkpoints are written
and read through transformer/checkpoint/store.py (with their integrity scheme), training's
save and resume policy is transformer/training/checkpoints.py. In a multi-host run process 0
alone trains a new vocabulary (`get_tokenizer`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections

from transformer import data as data_lib
from transformer import multihost

PyTree = Any


CONFIG_FILE = 'config.json'
VOCAB_FILE = os.path.join('vocab', 'spm.model')
DATA_CACHE = 'data_cache'
CHECKPOINTS = 'checkpoints'
# The best checkpoint lives in its own directory, not among CHECKPOINTS: those keep the last
# K steps (averaging and resuming need exactly those), so a best one there would either be
# deleted by max_to_keep or, with Orbax's best_fn, turn "the last K" into "the K best".
BEST = 'best'
METRICS_FILE = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'
FINAL_METRICS_FILE = 'final_metrics.json'
EVAL_DIR = 'eval'
MANIFEST = 'manifest.json'  # inside each checkpoints/<step>/
CORRUPT_CHECKPOINTS = 'corrupt_checkpoints'  # where training moves steps that failed checks


class WorkdirError(RuntimeError):
    """A workdir, checkpoint or vocabulary that cannot be used; the message says why."""


def path(workdir: str, *parts: str) -> str:
    """A path inside the run directory."""
    return os.path.join(workdir, *parts)


def vocab_path(config: ml_collections.ConfigDict, workdir: str | None) -> str | None:
    """``data.vocab_path`` if set, else the workdir's ``vocab/spm.model`` (None: no workdir)."""
    if config.data.get('vocab_path'):
        return config.data.vocab_path
    return path(workdir, VOCAB_FILE) if workdir else None


def data_cache_dir(config: ml_collections.ConfigDict, workdir: str | None) -> str | None:
    """``data.cache_dir``, else ``WORKDIR/data_cache``, else None (no disk cache)."""
    if config.data.get('cache_dir'):
        return config.data.cache_dir
    return path(workdir, DATA_CACHE) if workdir else None


def get_tokenizer(config: ml_collections.ConfigDict, workdir: str | None) -> data_lib.Tokenizer:
    """The run's vocabulary for training: reused when saved, else trained and saved.

    In a multi-host run process 0 alone trains and saves a new vocabulary; the others wait
    for it and load that file (SentencePiece training is only reproducible across hosts with
    the same thread count and library build).
    """
    model_path = vocab_path(config, workdir)
    if jax.process_count() == 1 or config.data.get('vocab_path'):
        return data_lib.get_tokenizer(config.data, model_path)
    built = []
    multihost.on_main(
        lambda: built.append(data_lib.get_tokenizer(config.data, model_path)),
        f'build the vocabulary {model_path}',
    )
    return built[0] if built else data_lib.get_tokenizer(config.data, model_path)


def load_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> data_lib.Tokenizer:
    """The run's saved vocabulary; never trains a new one (that would not match the model)."""
    model_path = vocab_path(config, workdir)
    if not os.path.exists(model_path):
        raise WorkdirError(
            f'No vocabulary at {model_path}: the workdir has no trained SentencePiece model '
            '(copy it there or set data.vocab_path).'
        )
    return data_lib.Tokenizer(model_path)


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    with open(path(workdir, CONFIG_FILE), 'w') as f:
        f.write(config.to_json_best_effort(indent=2))


def read_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a training run saved in ``WORKDIR/config.json``."""
    config_path = path(workdir, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise WorkdirError(
            f'{config_path} not found: {workdir} is not a run directory written by train.py.'
        )
    with open(config_path) as f:
        try:
            return ml_collections.ConfigDict(json.load(f))
        except json.JSONDecodeError as e:
            raise WorkdirError(f'{config_path} is not valid JSON ({e}); restore it.') from None


def error_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def step_dir(workdir: str, step: int, *, best: bool = False) -> str:
    """``WORKDIR/checkpoints/<step>`` (``best``: ``WORKDIR/best/<step>``)."""
    return path(os.path.abspath(workdir), BEST if best else CHECKPOINTS, str(step))
