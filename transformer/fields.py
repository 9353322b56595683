"""A config field's parts kept together: its type (the annotation), default, rule, upper
bound (``most``, with why) and one-line description (``doc``, what ``--help`` prints), and
the check every section runs on its fields: the model's `TransformerConfig` and the
schema's sections (transformer/schema/) validate one way."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal, get_args


class ConfigError(ValueError):
    """A config value that cannot work; the one-line message names the key."""


# Field rules: (predicate, what it wants), in a field's metadata.
def _rule(ok: Callable[[Any], bool], wanted: str) -> dict[str, Any]:
    return {'rule': (ok, wanted)}


POSITIVE = _rule(lambda v: v >= 1, 'an integer >= 1')
NON_NEGATIVE = _rule(lambda v: v >= 0, '>= 0')
POSITIVE_OR_NONE = _rule(lambda v: v >= 1, 'an integer >= 1 (or None)')
RATE = _rule(lambda v: 0 <= v < 1, 'in [0, 1)')
ABOVE_ZERO = _rule(lambda v: v > 0, '> 0')
AT_LEAST_2 = _rule(lambda v: v >= 2, 'an integer >= 2')
AT_LEAST_4 = _rule(lambda v: v >= 4, 'an integer >= 4')
# A switch: its annotation (bool) already refuses anything else; the rule says it in the
# declarations that take one (transformer/model/settings.py).
BOOL = _rule(lambda v: isinstance(v, bool), 'True or False')

# The largest values that can work, and why.
# jax makes a PRNG key of a seed that fits in 64 signed bits; the data order takes it too.
MAX_SEED = (2**63 - 1, "jax's PRNG keys take a signed 64-bit seed")
MAX_STEP = (2**31 - 1, 'the step counter is a 32-bit integer')
MAX_VOCAB = (2**31 - 1, "SentencePiece's vocabulary size is a 32-bit integer")
# jax.distributed.initialize hands its initialization_timeout to XLA's client, which takes a
# 32-bit count of seconds (a larger one fails there with a TypeError, after the run started).
MAX_INIT_TIMEOUT = (2**31 - 1, 'jax.distributed takes a 32-bit count of seconds')


def field(
    default: Any,
    rule: dict[str, Any] | None = None,
    most: tuple[int, str] | None = None,
    *,
    doc: str,
    optional: bool = False,
) -> Any:
    """A section's field: its default, rule, ``most`` (the largest value that can work, why)
    and ``doc``, its one-line description.

    ``optional``: a config may leave the field out. Configs written before the field existed
    lack it; they get ``default``, which must be the value those runs used, so an optional
    field's default never changes (a new choice goes into configs/base.py). A field that is
    not optional must be in every config (a missing one is a config error).
    """
    metadata = {**(rule or {}), 'most': most, 'doc': doc, 'optional': optional}
    return dataclasses.field(default=default, metadata=metadata)


def check_keys(section: str, names: Iterable[str], known: Iterable[str]) -> None:
    """`ConfigError` for the first of ``names`` (keys as a config or a command line gives them,
    below ``section``; '' for dotted keys of the whole config) that is not one of ``known``,
    with the nearest known key."""
    known = sorted(known)
    allowed, prefix = set(known), f'{section}.' if section else ''
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f'; did you mean {prefix}{close[0]}?' if close else ''
            raise ConfigError(f'unknown config key {prefix}{name}{hint}')


def matches(value: Any, want: Any) -> bool:
    """Whether ``value`` fits the annotation ``want`` (int for a float field, never a bool
    for a number; `Any` takes every value)."""
    if want is Any:
        return True
    origin = typing.get_origin(want)
    if origin is Literal:
        return value in get_args(want)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in get_args(want))
    if want is type(None):
        return value is None
    if origin is not None:  # Mapping[str, Any]
        return isinstance(value, origin)
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, (int, float) if want is float else want)


def describe(want: Any) -> str:
    origin = typing.get_origin(want)
    if origin is Literal:
        return 'one of ' + ', '.join(map(repr, get_args(want)))
    if origin in (typing.Union, types.UnionType):
        return ' or '.join(describe(arg) for arg in get_args(want))
    return 'None' if want is type(None) else f'of type {want.__name__}'


class Section:
    """Checks each field against its annotation and rule; `SECTION` names it in errors. A
    float must be finite: ``inf`` passes every lower bound and ``nan`` some rules, and either
    breaks the training step or decoding long after the run started."""

    SECTION = ''

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, key = getattr(self, f.name), f'{self.SECTION}.{f.name}'
            if not matches(value, hints[f.name]):
                raise ConfigError(f'{key}={value!r} must be {describe(hints[f.name])}.')
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f'{key}={value!r} must be a finite number.')
            ok, wanted = f.metadata.get('rule', (None, ''))
            if ok is not None and value is not None and not ok(value):
                raise ConfigError(f'{key}={value!r} must be {wanted}.')
            most = f.metadata.get('most')
            if most is not None and value is not None and value > most[0]:
                raise ConfigError(f'{key}={value!r} must be <= {most[0]} ({most[1]}).')
