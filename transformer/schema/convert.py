"""Between a config's plain values and its typed `Experiment`: `parse` (with `complete` for a
run's config.json written by an earlier version) and `to_dict` back; `default_config`, the
ConfigDict of every field at its default, and `descriptions`, every field's one line."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import ml_collections
from absl import logging
from ml_collections import config_dict

from transformer.data import sources as data_sources
from transformer.fields import ConfigError, check_keys
from transformer.model import VOCABULARY_FIELDS, TransformerConfig, config_from_dict
from transformer.schema.sections import (
    REMOVED_KEYS,
    REMOVED_VALUES,
    SECTIONS,
    DataSection,
    Experiment,
)


def _section(cls: type, values: Mapping[str, Any]) -> Any:
    fields = {f.name for f in dataclasses.fields(cls)} - {'sources'}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name != 'sources' and not f.metadata['optional'] and f.name not in values
    ]
    if missing:
        raise ConfigError(f'config key {cls.SECTION}.{missing[0]} is missing.')
    unknown = sorted(set(values) - fields)
    if cls is DataSection:
        known = {k: v for k, v in values.items() if k in fields}
        sources = {k: _frozen(values[k]) for k in unknown}
        return cls(**known, sources=types.MappingProxyType(sources))
    check_keys(cls.SECTION, values, fields)
    return cls(**values)


# What `parse` takes: a config file's ConfigDict, its plain dict (config.json), or typed
# already. Functions below the commands that take a config take this and parse it once.
Config = ml_collections.ConfigDict | Mapping[str, Any] | Experiment


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
        if f.name not in VOCABULARY_FIELDS
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
    model = {k: v for k, v in model.items() if f'model.{k}' not in REMOVED_KEYS}
    try:
        data = sections['data']
        model_config = config_from_dict(model, data.vocab_size, data.special)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    return Experiment(model=model_config, **sections)


def complete(config: ml_collections.ConfigDict | Mapping[str, Any]) -> dict:
    """The plain dict of ``config`` with the optional fields it predates set to their defaults
    (the values its run used) and removed keys dropped (for a run directory's config.json
    written by an earlier version); ``config`` itself is left as it is. A removed value
    (`REMOVED_VALUES`) loads as its replacement with one warning line, or stops in one line."""
    values = copy.deepcopy(plain(config))
    _replace_removed_values(values)
    for name, cls in SECTIONS.items():
        section = values.setdefault(name, {})
        if not isinstance(section, Mapping):
            continue  # not a section: `parse` names it
        for f in dataclasses.fields(cls):
            if f.name != 'sources' and f.metadata['optional']:
                section.setdefault(f.name, f.default)
    for key in REMOVED_KEYS:
        section, name = key.split('.')
        if isinstance(values.get(section), Mapping):
            values[section].pop(name, None)
    return values


def _replace_removed_values(values: dict) -> None:
    """Replaces each removed value of ``values`` in place (`REMOVED_VALUES`), with a warning;
    ConfigError for one that has no replacement."""
    for (key, old), (new, why) in REMOVED_VALUES.items():
        section, name = key.split('.')
        if not isinstance(values.get(section), Mapping) or values[section].get(name) != old:
            continue
        removed = f'{key}={old!r} was removed (docs/experiments.md, "Removed options"): {why}'
        if new is None:
            raise ConfigError(f'{removed}.')
        logging.warning('%s; it loads as %r.', removed, new)
        values[section][name] = new


def _model_fields() -> list[dataclasses.Field]:
    """The model section's fields: TransformerConfig's, but the vocabulary (data's)."""
    return [f for f in dataclasses.fields(TransformerConfig) if f.name not in VOCABULARY_FIELDS]


def _defaults(cls: type, fields: list[dataclasses.Field]) -> ml_collections.ConfigDict:
    """A ConfigDict of ``fields`` at their defaults; a None default is a placeholder of the
    field's type, so that ``--config.KEY=VALUE`` can set it."""
    hints = typing.get_type_hints(cls)
    section = ml_collections.ConfigDict()
    for f in fields:
        value = f.default
        if value is None:
            kind = next(t for t in typing.get_args(hints[f.name]) if t is not type(None))
            value = config_dict.placeholder(kind)
        elif f.name in ('dtype', 'param_dtype'):
            value = jnp.dtype(value).name
        section[f.name] = value
    return section


def default_config() -> ml_collections.ConfigDict:
    """Every section with every field at its default, the data sources' own keys included:
    the config that configs/base.py starts from."""
    config = ml_collections.ConfigDict()
    config.model = _defaults(TransformerConfig, _model_fields())
    for name, cls in SECTIONS.items():
        fields = [f for f in dataclasses.fields(cls) if f.name != 'sources']
        config[name] = _defaults(cls, fields)
    for key, (default, kind, _) in data_sources.own_keys().items():  # the sources' own keys
        *parents, name = key.split('.')
        node = config.data
        for part in parents:
            if part not in node:
                node[part] = ml_collections.ConfigDict()
            node = node[part]
        node[name] = config_dict.placeholder(kind) if default is None else default
    return config


def descriptions() -> dict[str, str]:
    """Dotted key -> its one-line description, for every field (what ``--help`` prints)."""
    # A variant's field describes itself when read (its registered values).
    found = {f'model.{f.name}': str(f.metadata['doc']) for f in _model_fields()}
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name != 'sources':
                found[f'{name}.{f.name}'] = f.metadata['doc']
    return found | {f'data.{key}': doc for key, (_, _, doc) in data_sources.own_keys().items()}
