"""The experiment config's schema: one frozen, typed dataclass per section.

Configs are written as ml_collections ConfigDicts (transformer/configs/), which give every
field a ``--config.section.key=value`` override. `parse` turns one into an `Experiment` once,
at the command line, and the run reads only the typed sections: every field's type, range and
choices are checked in the sections' ``__post_init__``, so a value that cannot work stops the
command in one line before anything is written. config.json holds `to_dict` of it, and
`rundir.read_config` parses it back. The model section is the model's own `TransformerConfig`,
whose rules live with the network (transformer/model/config.py).

Each choice list is written here once, as a ``Literal``; the modules that act on a choice
import its tuple (``SCHEDULES``, ``DROPOUT_PRNGS``, ...). A field a config written before the
field existed may lack has its default here, the value such a run used; `complete` fills
those in when a run directory's config.json is read, so no reader carries a default of its
own.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

import jax.numpy as jnp
import ml_collections

from transformer.data import sources as data_sources
from transformer.data.errors import DataError
from transformer.data.packing import LONG_EXAMPLES
from transformer.data.tokenizer import MODEL_TYPES, NORMALIZATIONS
from transformer.model.config import TransformerConfig, config_from_dict

Schedule = Literal['rsqrt', 'constant']  # the paper's warm-up + inverse square root; a constant
DropoutPrng = Literal['threefry', 'rbg', 'unsafe_rbg', 'philox4x32']
Parallelism = Literal['pmap', 'sharding']  # transformer/training/parallel.py
BestMetric = Literal['sacrebleu', 'tokenized_bleu', 'chrf']  # validation scores, higher = better
VocabModelType = Literal[MODEL_TYPES]
VocabNormalization = Literal[NORMALIZATIONS]
LongExamples = Literal[LONG_EXAMPLES]

SCHEDULES: tuple[str, ...] = get_args(Schedule)
DROPOUT_PRNGS: tuple[str, ...] = get_args(DropoutPrng)
PARALLELISMS: tuple[str, ...] = get_args(Parallelism)
METRICS: tuple[str, ...] = get_args(BestMetric)

# Keys of configs written by earlier versions that no longer exist; dropped when read.
# model.max_len: the longest row is data.max_len (the model has no length limit of its own).
RETIRED_KEYS = ('model.max_len',)


class ConfigError(ValueError):
    """A config value that cannot work; the one-line message names the key."""


# Field rules: (predicate, what it wants), in a field's metadata.
def _rule(ok: Callable[[Any], bool], wanted: str) -> dict[str, Any]:
    return {'rule': (ok, wanted)}


POSITIVE = _rule(lambda v: v >= 1, 'an integer >= 1')
NON_NEGATIVE = _rule(lambda v: v >= 0, '>= 0')
RATE = _rule(lambda v: 0 <= v < 1, 'in [0, 1)')
ABOVE_ZERO = _rule(lambda v: v > 0, '> 0')


def _field(
    default: Any = dataclasses.MISSING,
    rule: dict[str, Any] | None = None,
    most: tuple[int, str] | None = None,
) -> Any:
    """A field with its default, its rule and ``most``: (the largest value that can work, why)."""
    return dataclasses.field(default=default, metadata={**(rule or {}), 'most': most})


# jax makes a PRNG key of a seed that fits in 64 signed bits; the data order takes it too.
MAX_SEED = (2**63 - 1, "jax's PRNG keys take a signed 64-bit seed")
MAX_STEP = (2**31 - 1, 'the step counter is a 32-bit integer')
MAX_VOCAB = (2**31 - 1, "SentencePiece's vocabulary size is a 32-bit integer")


def _matches(value: Any, want: Any) -> bool:
    """Whether ``value`` fits the annotation ``want`` (int for a float field, never a bool
    for a number)."""
    origin = typing.get_origin(want)
    if origin is Literal:
        return value in get_args(want)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in get_args(want))
    if want is type(None):
        return value is None
    if origin is not None:  # Mapping[str, Any]
        return isinstance(value, origin)
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, (int, float) if want is float else want)


def _describe(want: Any) -> str:
    origin = typing.get_origin(want)
    if origin is Literal:
        return 'one of ' + ', '.join(map(repr, get_args(want)))
    if origin in (typing.Union, types.UnionType):
        return ' or '.join(_describe(arg) for arg in get_args(want))
    return 'None' if want is type(None) else f'of type {want.__name__}'


class _Section:
    """Checks each field against its annotation and rule; `SECTION` names it in errors. A
    float must be finite: ``inf`` passes every lower bound and ``nan`` some rules, and either
    breaks the training step or decoding long after the run started."""

    SECTION = ''

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, key = getattr(self, f.name), f'{self.SECTION}.{f.name}'
            if not _matches(value, hints[f.name]):
                raise ConfigError(f'{key}={value!r} must be {_describe(hints[f.name])}.')
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f'{key}={value!r} must be a finite number.')
            ok, wanted = f.metadata.get('rule', (None, ''))
            if ok is not None and value is not None and not ok(value):
                raise ConfigError(f'{key}={value!r} must be {wanted}.')
            most = f.metadata.get('most')
            if most is not None and value is not None and value > most[0]:
                raise ConfigError(f'{key}={value!r} must be <= {most[0]} ({most[1]}).')


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection(_Section):
    """The pipeline's common keys (transformer/data/config.py says what each does). Each
    source declares and checks its own keys (``manual_dir``, ``folder``, ``synthetic``, ...:
    its ``add_config``); they are kept in ``sources``, read-only, and read as attributes like
    the others (``data.manual_dir``, ``data.synthetic.num_train``)."""

    SECTION = 'data'
    dataset: str
    source_lang: str
    target_lang: str
    train_split: str
    eval_split: str
    test_split: str
    vocab_size: int = _field(rule=_rule(lambda v: v >= 4, 'an integer >= 4'), most=MAX_VOCAB)
    vocab_model_type: VocabModelType = 'bpe'
    vocab_normalization: VocabNormalization = 'nmt_nfkc'
    vocab_sample_size: int = _field(rule=POSITIVE)
    vocab_path: str | None = None
    max_len: int = _field(rule=_rule(lambda v: v >= 2, 'an integer >= 2'))
    long_examples: LongExamples = 'drop'
    cache_dir: str | None = None
    sources: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        try:  # the source's own keys and the splits, by the source that owns them
            data_sources.check(self)
        except DataError as e:
            raise ConfigError(str(e)) from None

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: a source's own key.
        sources = self.__dict__.get('sources', {})
        if name in sources:
            return sources[name]
        raise AttributeError(f'data has no key {name!r}')


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptSection(_Section):
    SECTION = 'opt'
    schedule: Schedule = 'rsqrt'
    warmup_steps: int = _field(rule=POSITIVE)
    lr_scale: float = _field(rule=ABOVE_ZERO)
    cooldown_steps: int = _field(0, NON_NEGATIVE)
    b1: float = _field(rule=RATE)
    b2: float = _field(rule=RATE)
    eps: float = _field(rule=NON_NEGATIVE)
    clip_grad_norm: float = _field(rule=NON_NEGATIVE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection(_Section):
    SECTION = 'train'
    seed: int = _field(0, NON_NEGATIVE, MAX_SEED)
    num_steps: int = _field(rule=POSITIVE, most=MAX_STEP)
    batch_size: int = _field(rule=POSITIVE)
    grad_accum_steps: int = _field(rule=POSITIVE)
    label_smoothing: float = _field(rule=RATE)
    dropout_prng: DropoutPrng = DROPOUT_PRNGS[0]  # threefry: runs before the choice drew with it
    parallelism: Parallelism
    model_parallelism: int = _field(rule=POSITIVE)
    fsdp: bool = False
    prefetch: int = _field(2, NON_NEGATIVE)
    log_every: int = _field(rule=POSITIVE)
    eval_every: int = _field(rule=NON_NEGATIVE)
    checkpoint_every: int = _field(rule=POSITIVE)
    keep_checkpoints: int = _field(rule=POSITIVE)
    async_checkpointing: bool = True
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = _field(None, POSITIVE)
    process_id: int | None = _field(None, NON_NEGATIVE)
    init_timeout_s: int = _field(60, POSITIVE)
    early_stop_patience: int = _field(0, NON_NEGATIVE)
    loss_chunk_tokens: int = _field(0, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection(_Section):
    SECTION = 'eval'
    beam_size: int = _field(rule=POSITIVE)
    alpha: float = _field(rule=NON_NEGATIVE)
    extra_length: int = _field(rule=NON_NEGATIVE)
    average_last: int = _field(rule=POSITIVE)
    batch_size: int = _field(rule=POSITIVE)
    bleu_every: int = _field(rule=NON_NEGATIVE)
    bleu_max_examples: int = _field(0, NON_NEGATIVE)
    best_metric: BestMetric = 'sacrebleu'
    # Tokenized BLEU's conventions (transformer/evaluation/bleu.py); every packaged config
    # splits compounds, the WMT14 English -> German convention.
    compound_split: bool = True
    lowercase_tokenized: bool = False


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A whole config, typed; the rules between sections are checked here."""

    model: TransformerConfig
    data: DataSection
    opt: OptSection
    train: TrainSection
    eval: EvalSection

    def __post_init__(self):
        if self.opt.cooldown_steps > self.train.num_steps:
            raise ConfigError(
                f'opt.cooldown_steps={self.opt.cooldown_steps} exceeds train.num_steps='
                f'{self.train.num_steps}.'
            )
        if self.eval.beam_size > self.data.vocab_size:
            raise ConfigError(
                f'eval.beam_size={self.eval.beam_size} exceeds data.vocab_size='
                f'{self.data.vocab_size}: a beam cannot hold more hypotheses than the first '
                'step has words.'
            )


SECTIONS = {'data': DataSection, 'opt': OptSection, 'train': TrainSection, 'eval': EvalSection}


def _section(cls: type, values: Mapping[str, Any]) -> Any:
    fields = {f.name for f in dataclasses.fields(cls)} - {'sources'}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in values
    ]
    if missing:
        raise ConfigError(f'config key {cls.SECTION}.{missing[0]} is missing.')
    unknown = sorted(set(values) - fields)
    if cls is DataSection:
        known = {k: v for k, v in values.items() if k in fields}
        sources = {k: _frozen(values[k]) for k in unknown}
        return cls(**known, sources=types.MappingProxyType(sources))
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(fields), n=1)
        hint = f'; did you mean {cls.SECTION}.{close[0]}?' if close else ''
        raise ConfigError(f'unknown config key {cls.SECTION}.{unknown[0]}{hint}')
    return cls(**values)


def plain(config: ml_collections.ConfigDict | Mapping[str, Any], name: str = '') -> dict:
    """The plain dict of a config or of its section ``name``; ConfigError for anything else
    (a config.json holding ``[]``, a section that is ``null``)."""
    if isinstance(config, ml_collections.ConfigDict):
        return config.to_dict()
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        what = f'config section {name}' if name else 'the config'
        raise ConfigError(f'{what} is {config!r:.60}, not a mapping of keys to values.')
    return dict(config)


def _frozen(value: Any) -> Any:
    """A nested section of a source (``synthetic``) as a read-only ConfigDict."""
    if isinstance(value, Mapping):
        return ml_collections.FrozenConfigDict(plain(value))
    return value


def to_dict(experiment: Experiment) -> dict[str, Any]:
    """The plain, JSON-ready values of ``experiment``, as a config file holds them (dtypes by
    name, the data sources' keys in the data section): what config.json records."""
    model = {
        f.name: getattr(experiment.model, f.name)
        for f in dataclasses.fields(experiment.model)
        if f.name != 'vocab_size'
    }
    for key in ('dtype', 'param_dtype'):
        model[key] = jnp.dtype(model[key]).name
    data = {f.name: getattr(experiment.data, f.name) for f in dataclasses.fields(DataSection)}
    sources = data.pop('sources')
    data |= {k: v.to_dict() if hasattr(v, 'to_dict') else v for k, v in sources.items()}
    out = {'model': model, 'data': data}
    for name in ('opt', 'train', 'eval'):
        out[name] = dataclasses.asdict(getattr(experiment, name))
    return out


def parse(config: ml_collections.ConfigDict | Mapping[str, Any]) -> Experiment:
    """The typed `Experiment` of a config; `ConfigError` (one line) for the first value that
    cannot work."""
    values = plain(config)
    for section in ('model', *SECTIONS):
        if section not in values:
            raise ConfigError(f'config section {section} is missing.')
    sections = {name: _section(cls, plain(values[name], name)) for name, cls in SECTIONS.items()}
    model = plain(values['model'], 'model')
    model = {k: v for k, v in model.items() if f'model.{k}' not in RETIRED_KEYS}
    try:
        model_config = config_from_dict(model, sections['data'].vocab_size)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    return Experiment(model=model_config, **sections)


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` with the fields it predates set to their defaults and retired keys removed
    (for a run directory's config.json written by an earlier version)."""
    values = plain(config)
    for name, cls in SECTIONS.items():
        section = values.setdefault(name, {})
        if not isinstance(section, Mapping):
            continue  # not a section: `parse` names it
        for f in dataclasses.fields(cls):
            if f.name != 'sources' and f.default is not dataclasses.MISSING:
                section.setdefault(f.name, f.default)
    for key in RETIRED_KEYS:
        section, name = key.split('.')
        if isinstance(values.get(section), Mapping):
            values[section].pop(name, None)
    return ml_collections.ConfigDict(values)
