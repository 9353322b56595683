"""The run directory: the one place that knows what a workdir holds and how to read it.

    WORKDIR/config.json          the experiment config the run started with, its paths absolute
    WORKDIR/config_history.jsonl settings changed by later resumes (step, key, old, new)
    WORKDIR/vocab/spm.model      the joint SentencePiece vocabulary, or
    WORKDIR/vocab/...            a pretrained family's vocabulary (MarianMT's vocab.json,
                                 source.spm, target.spm, tokenizer_config.json) of a run
                                 converted from, or started from, a pretrained model (its
                                 family reads it: `transformer.interop`)
    WORKDIR/converted_from.json  where a converted run's parameters came from (transformer.convert),
                                 its family, and its source's config files (`converted_source`)
    WORKDIR/data_cache/          token ids: the training split's token store (memory-mapped,
                                 transformer/data/token_store.py), the evaluation splits'
                                 .npz files (transformer/data/tokenized.py)
    WORKDIR/checkpoints/<step>/  Orbax: params, opt_state, meta (step, seed, data position,
                                 the best validation score so far and the patience count)
    WORKDIR/best/<step>/         Orbax: params and meta of the best validation BLEU so far
    WORKDIR/metrics.jsonl        every logged metric; WORKDIR/tensorboard/ the same as events
    WORKDIR/eval/                hypotheses and scores written by ``transformer.evaluate``
    WORKDIR/train.lock           held while a process trains here (transformer/lock.py)
    WORKDIR/shared_check         a multi-host run's check that its processes share the
                                 workdir (`multihost.check_shared`)

Every path inside a run directory is named here and nowhere else. Checkpoints are written
and read through transformer/checkpoint/ alone (with their integrity scheme and training's
save and resume policy). In a multi-host run process 0
alone trains a new vocabulary (`get_tokenizer`).
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Any

import jax

from transformer import data as data_lib
from transformer import interop, multihost, schema
from transformer.lock import LOCK_FILE

PyTree = Any


CONFIG_FILE = 'config.json'
VOCAB_DIR = 'vocab'
VOCAB_FILE = os.path.join(VOCAB_DIR, 'spm.model')
# Marks a run written by transformer.convert: parameters without an optimizer state.
CONVERTED_FILE = 'converted_from.json'
# Its key holding the source directory's config files, {file name: its JSON object or None}.
SOURCE_FILES = 'source_files'
FAMILY_KEY = 'family'  # converted_from.json's: the pretrained family (`converted_family`)
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
HISTORY_FILE = 'config_history.jsonl'  # settings changed by resumes (`run_changes`)
SHARED_CHECK = 'shared_check'  # process 0's mark the others must see (multihost.check_shared)
# Everything a run writes at its top level: a directory holding anything else is not a run's.
RUN_ENTRIES = (
    *(CONFIG_FILE, HISTORY_FILE, VOCAB_DIR, CONVERTED_FILE, DATA_CACHE, CHECKPOINTS, BEST),
    *(METRICS_FILE, TENSORBOARD, FINAL_METRICS_FILE, EVAL_DIR, CORRUPT_CHECKPOINTS, SHARED_CHECK),
    LOCK_FILE,
)
# The weights of the model formats a user may keep beside our runs: Hugging Face (every
# family), its sharded files, PyTorch's and CTranslate2's.
WEIGHT_PATTERNS = (
    *('*.safetensors', 'pytorch_model*.bin', 'tf_model*.h5', 'flax_model*.msgpack'),
    *('model.bin', '*.ckpt', '*.pt', '*.pth'),
)
# A model directory's own files, which no run writes at its top: weights, configs,
# vocabularies, tokenizers (`is_model_file`).
MODEL_FILE_PATTERNS = (
    *WEIGHT_PATTERNS,
    *('config.json', 'generation_config.json', '*tokenizer*.json', 'special_tokens_map.json'),
    *('vocab.json', '*.spm', '*.model', '*vocabulary*'),
)
# Paths training writes into, checked before it writes (`create`): one of the wrong kind
# failed late, after other files were written, and a link to checkpoints on a disk that is
# not mounted read as "no checkpoints yet".
_DIRECTORIES = (CHECKPOINTS, BEST, TENSORBOARD)
_FILES = (CONFIG_FILE, HISTORY_FILE, METRICS_FILE, FINAL_METRICS_FILE)


class WorkdirError(RuntimeError):
    """A workdir, checkpoint or vocabulary that cannot be used; the message says why."""


def wrong_kind(file: str, directory: bool) -> str | None:
    """Why ``file`` cannot be the directory (or the file) it should be, or None: a link to
    nothing, a file where a directory belongs or the other way round. Absent is fine."""
    if os.path.islink(file) and not os.path.exists(file):
        return f'{file} is a link to {os.readlink(file)}, which does not exist (not mounted?)'
    if directory and os.path.exists(file) and not os.path.isdir(file):
        return f'{file} is a file, not a directory'
    if not directory and os.path.isdir(file):
        return f'{file} is a directory, not a file'
    return None


def create(workdir: str) -> bool:
    """Makes the run directory (True) or finds it (False), after `check_kinds`."""
    check_kinds(workdir)
    created = not os.path.isdir(workdir)
    os.makedirs(workdir, exist_ok=True)
    return created


def check_kinds(workdir: str) -> None:
    """A one-line `WorkdirError` when ``workdir`` or a path training writes into is of the
    wrong kind (`wrong_kind`); reads nothing but the paths themselves."""
    problem = wrong_kind(workdir, directory=True)
    if problem:
        raise WorkdirError(f'{problem}: give --workdir the directory of the run.')
    for names, directory in ((_DIRECTORIES, True), (_FILES, False)):
        for name in names:
            problem = wrong_kind(path(workdir, name), directory)
            if problem:
                raise WorkdirError(f'{problem}: restore it, or train in a new --workdir.')


def path(workdir: str, *parts: str) -> str:
    """A path inside the run directory."""
    return os.path.join(workdir, *parts)


Config = schema.Config  # as a file gives it, as config.json holds it, or typed
# A run's vocabulary: the joint SentencePiece model trained for it (`data.Tokenizer`), or a
# pretrained family's vocabulary of a run converted or fine-tuned from one
# (`pretrained_vocab_dir`, `interop.Family.load_vocabulary`); each is a `data_lib.Vocabulary`, whose
# special ids must be the ones config.json records.
Vocabulary = data_lib.Vocabulary


def vocab_path(config: Config, workdir: str | None) -> str | None:
    """``data.vocab_path`` if set, else the workdir's ``vocab/spm.model`` (None: no workdir)."""
    if config.data.vocab_path:
        return config.data.vocab_path
    return path(workdir, VOCAB_FILE) if workdir else None


def pretrained_vocab_dir(config: Config, workdir: str | None) -> str | None:
    """``WORKDIR/vocab`` when it holds a pretrained family's vocabulary
    (`interop.held_vocabulary`), else None; never with ``data.vocab_path`` set."""
    if config.data.vocab_path or not workdir:
        return None
    directory = path(workdir, VOCAB_DIR)
    return directory if interop.held_vocabulary(directory) else None


def is_converted(workdir: str) -> bool:
    """Whether ``workdir`` was written by transformer.convert (no optimizer state)."""
    return os.path.isfile(path(workdir, CONVERTED_FILE))


def converted_source(workdir: str) -> dict[str, Any] | None:
    """A converted run's record of its source's config files (`SOURCE_FILES`); None for a run
    trained here or converted before they were recorded."""
    file = path(workdir, CONVERTED_FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding='utf-8') as f:
            return json.load(f).get(SOURCE_FILES)
    except (OSError, ValueError, AttributeError) as e:
        raise WorkdirError(f'{file} cannot be read ({e}); restore it.') from None


def converted_family(workdir: str) -> str | None:
    """The pretrained family a converted run came from (converted_from.json's `FAMILY_KEY`;
    `interop.UNRECORDED_FAMILY` for a run converted before it was recorded), None for a run
    not converted."""
    file = path(workdir, CONVERTED_FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding='utf-8') as f:
            return json.load(f).get(FAMILY_KEY, interop.UNRECORDED_FAMILY)
    except (OSError, ValueError, AttributeError) as e:
        raise WorkdirError(f'{file} cannot be read ({e}); restore it.') from None


def data_cache_dir(config: Config, workdir: str | None) -> str | None:
    """``data.cache_dir``, else ``WORKDIR/data_cache``, else None (no disk cache)."""
    if config.data.cache_dir:
        return config.data.cache_dir
    return path(workdir, DATA_CACHE) if workdir else None


def get_tokenizer(config: Config, workdir: str | None) -> Vocabulary:
    """The run's vocabulary for training: the pretrained one it holds, or its SentencePiece
    model, reused when saved, else trained and saved.

    In a multi-host run process 0 alone trains and saves a new vocabulary; the others wait
    for it and load that file (SentencePiece training is only reproducible across hosts with
    the same thread count and library build).
    """
    pretrained = pretrained_vocab_dir(config, workdir)
    if pretrained:
        return _recorded(_pretrained_vocabulary(pretrained, config), config, pretrained)
    model_path = vocab_path(config, workdir)
    if jax.process_count() == 1 or config.data.vocab_path:
        return _recorded(data_lib.get_tokenizer(config.data, model_path), config, model_path)
    built = []
    multihost.on_main(
        lambda: built.append(data_lib.get_tokenizer(config.data, model_path)),
        f'build the vocabulary {model_path}',
    )
    vocab = built[0] if built else data_lib.get_tokenizer(config.data, model_path)
    return _recorded(vocab, config, model_path)


def load_tokenizer(config: Config, workdir: str) -> Vocabulary:
    """The run's saved vocabulary; never trains a new one (that would not match the model)."""
    pretrained = pretrained_vocab_dir(config, workdir)
    if pretrained:
        return _recorded(_pretrained_vocabulary(pretrained, config), config, pretrained)
    model_path = vocab_path(config, workdir)
    if not os.path.exists(model_path):
        fix = 'the workdir has no trained SentencePiece model (copy it or set data.vocab_path)'
        if config.data.vocab_path:  # a file the run's config names, since moved
            fix = f'set data.vocab_path in {path(workdir, CONFIG_FILE)} to where it is now'
        raise WorkdirError(f'No vocabulary at {model_path}: {fix}.')
    return _recorded(data_lib.Tokenizer(model_path, data_config=config.data), config, model_path)


def _recorded(vocab: Vocabulary, config: Config, where: str) -> Vocabulary:
    """``vocab``, whose special ids must be the ones the run records (config.json's data
    section, `data_lib.special_of`): the model and the searches read those."""
    try:
        data_lib.check_special(vocab.special, data_lib.special_of(config.data), where)
    except data_lib.DataError as e:
        raise WorkdirError(str(e)) from None
    return vocab


def _pretrained_vocabulary(directory: str, config: Config) -> Vocabulary:
    # The ids never emitted are the run's record (a MarianMT's banned words live in its
    # generation config, which the vocabulary's files do not hold).
    try:
        family = interop.held_vocabulary(directory)
        never_emit = data_lib.special_of(config.data).never_emit
        return family.load_vocabulary(directory, never_emit=never_emit)
    except data_lib.DataError as e:
        raise WorkdirError(f'{e} Restore the vocabulary the run was converted with.') from None


def plain_values(config: Config) -> dict[str, Any]:
    """A config's plain values as JSON holds them."""
    if isinstance(config, schema.Experiment):
        return json.loads(json.dumps(schema.to_dict(config)))
    return json.loads(config.to_json_best_effort())


def write_config(workdir: str, config: Config) -> None:
    """Writes ``config.json``: the settings a run starts with (later changes:
    `run_changes.keep_record`)."""
    if isinstance(config, schema.Experiment):  # read from any directory later
        config = schema.absolute_paths(config)
    with open(path(workdir, CONFIG_FILE), 'w') as f:
        f.write(json.dumps(plain_values(config), indent=2))


def read_config(workdir: str) -> schema.Experiment:
    """The run's typed config as it trains now: ``config.json`` with the changes of later
    resumes (``config_history.jsonl``) applied, and the fields it predates at the values its run
    used.

    Raises:
      WorkdirError: one line naming the file (and the line of the history) and the key of
        the first value that cannot be used: a file that is not JSON, not the config's shape,
        or holds a value the schema refuses (a non-finite or mistyped one). Such a value is
        never used.
    """
    config_path = path(workdir, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise WorkdirError(
            f'{config_path} not found: {workdir} is not a run directory written by train.py.'
        )
    values = _load_json(config_path, _read_text(config_path))
    try:
        config = schema.complete(values)  # the fields it predates, as its run used them
        experiment = schema.parse(config)
    except schema.ConfigError as e:
        raise WorkdirError(f'{config_path}: {e}') from None
    history = path(workdir, HISTORY_FILE)
    for line, change in read_history(workdir, numbered=True):
        where = f'{history}, line {line}'
        try:
            _apply(config, change)
            config = schema.complete(config)  # a change to a value since removed
            experiment = schema.parse(config)
        except (schema.ConfigError, KeyError, TypeError) as e:
            raise WorkdirError(f'{where}: {e.args[0] if e.args else e}') from None
    return experiment


def _read_text(file: str) -> str:
    try:
        with open(file, encoding='utf-8') as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkdirError(f'{file} cannot be read: {error_line(e)}') from None


def _load_json(file: str, text: str, line: int | None = None) -> Any:
    """JSON of a run file; the strict parser reads NaN and Infinity, which the schema then
    refuses by key."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f'{file}, line {line}' if line is not None else file
        raise WorkdirError(f'{where} is not valid JSON ({e}); restore it.') from None


def _apply(config: dict[str, Any], change: Any) -> None:
    """Sets one recorded change (``{'step', 'key', 'old', 'new'}``) in the plain ``config``."""
    if not (isinstance(change, dict) and isinstance(change.get('key'), str) and 'new' in change):
        raise TypeError(f'{change!r:.80} is not a change {{"step", "key", "old", "new"}}')
    *parents, name = change['key'].split('.')
    node = config
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f'key {change["key"]} names no config setting')
        node = node[part]
    if isinstance(node, dict) and name in node:
        node[name] = change['new']


def read_history(workdir: str, *, numbered: bool = False) -> list[Any]:
    """The changes of settings recorded by resumes, oldest first (step, key, old, new);
    ``numbered``: (line number, change) pairs. A line that is not JSON raises `WorkdirError`
    naming the file and the line; `read_config` checks what each holds."""
    history = path(workdir, HISTORY_FILE)
    if not os.path.exists(history):
        return []
    changes = [
        (number, _load_json(history, line, number))
        for number, line in enumerate(_read_text(history).splitlines(), start=1)
        if line.strip()
    ]
    return changes if numbered else [change for _, change in changes]


def read_final_metrics(workdir: str) -> dict[str, Any]:
    """``final_metrics.json`` of a finished run; a one-line `WorkdirError` naming the file
    when it is not a JSON object."""
    file = path(workdir, FINAL_METRICS_FILE)
    final = _load_json(file, _read_text(file))
    if not isinstance(final, dict):
        raise WorkdirError(f'{file} holds {final!r:.60}, not the metrics of a run; restore it.')
    return final


def is_model_file(name: str) -> bool:
    """Whether ``name`` is one of a model directory's own files (`MODEL_FILE_PATTERNS`)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def has_checkpoints(workdir: str) -> bool:
    """Whether ``WORKDIR/checkpoints`` holds a step (a run that has trained something)."""
    directory = path(workdir, CHECKPOINTS)
    return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))


def error_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def step_dir(workdir: str, step: int, *, best: bool = False) -> str:
    """``WORKDIR/checkpoints/<step>`` (``best``: ``WORKDIR/best/<step>``)."""
    return path(os.path.abspath(workdir), BEST if best else CHECKPOINTS, str(step))
