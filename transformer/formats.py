"""What an export format writes of a model: one declaration per format, and the refusal of
everything it does not declare.

Each format (each pretrained family's export, transformer/interop/: MarianMT's in
marian_export.py; the CTranslate2 export, transformer/commands/ctranslate2_spec.py)
declares, in one `Format`, the values of the model's variant fields (the entries of
transformer/model/variants.py, by their config field) and of its numeric settings
(transformer/model/settings.py) that its writer maps, each as a `Writes`: the values, or a
check of the whole config where a setting is written in part (a head size MarianMT fixes).
A field the format does not name is written at its default only: the default is the network
of the runs written before the field existed, which the format wrote then. Any other value is
refused in one line naming the field, before anything is written (`Format.refusal`), so a
variant registered later is refused by every format until its writer maps it, not written as
something else.

The declarations are plain data, importable without jax: the CTranslate2 export's child
process reads its module and never imports jax. `ExportError` and `max_length` are what
every format's writer shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Config = Any  # a TransformerConfig, or a config's model section: read by field name


@dataclasses.dataclass(frozen=True)
class Writes:
    """What one format writes of one model field.

    Attributes:
      values: the values it writes (with ``check``: unused).
      why: why it writes no other value, the start of the refusal ("MarianMT's norms are
        LayerNorms"), which the values it writes follow.
      check: for a setting written in part: (cfg) -> why ``cfg``'s value is not written (one
        sentence naming the field and what does export), or None where it is.
    """

    values: tuple[Any, ...] = ()
    why: str = ''
    check: Callable[[Config], str | None] | None = None

    def reason(self, name: str, key: str, cfg: Config) -> str | None:
        """Why format ``name`` does not write ``cfg``'s value of ``key``, or None."""
        if self.check is not None:
            return self.check(cfg)
        value = getattr(cfg, key)
        if value in self.values:
            return None
        *others, last = map(repr, self.values)
        values = f'{", ".join(others)} or {last}' if others else last
        if self.why:
            return f'{self.why}; only {key}={values} exports to it'
        return f'{name} writes {key}={values} only'


def _every(cfg: Config) -> None:
    del cfg


# Every value of the field is written.
EVERY_VALUE = Writes(check=_every)


def heads_of_d_model(who: str) -> Writes:
    """``head_dim`` written only as d_model / num_heads (None or that value): ``who`` names
    the format's model in the refusal ("MarianMT")."""

    def check(cfg: Config) -> str | None:
        if cfg.head_dim is None or cfg.head_dim * cfg.num_heads == cfg.d_model:
            return None
        return (
            f'{who} fixes head_dim = d_model / num_heads = {cfg.d_model // cfg.num_heads}; '
            'only head_dim=None (or equal to that) exports.'
        )

    return Writes(check=check)


def one_kv_head_per_query(who: str) -> Writes:
    """``num_kv_heads`` written only as num_heads (None or that value): no grouped keys and
    values in ``who``'s model."""

    def check(cfg: Config) -> str | None:
        if cfg.num_kv_heads in (None, cfg.num_heads):
            return None
        return (
            f'{who} has one key/value head per query head; only num_kv_heads=None (or '
            'num_heads) exports.'
        )

    return Writes(check=check)


@dataclasses.dataclass(frozen=True)
class Format:
    """One export format's declaration of what it writes.

    Attributes:
      flag: its ``--format`` value ('hf', 'ctranslate2').
      name: what the messages call it ('MarianMT').
      fields: {model field: what it writes of it}; a field not named here is written at its
        default only.
    """

    flag: str
    name: str
    fields: Mapping[str, Writes]

    def field_refusal(self, key: str, default: Any, cfg: Config) -> str | None:
        """Why this format does not write ``cfg``'s value of ``key`` (whose default is
        ``default``), or None."""
        writes = self.fields.get(key, Writes((default,)))
        return writes.reason(self.name, key, cfg)

    def refusal(
        self, cfg: Config, defaults: Mapping[str, Any], others: Sequence[Format] = ()
    ) -> str | None:
        """One line for the first field of ``defaults`` ({field: default}: the model's
        variant fields and numeric settings) whose value in ``cfg`` this format does not
        write, naming the formats of ``others`` that write it; None if it writes them all.
        A field ``cfg`` lacks (a config of a program without it) is its default."""
        for key, default in defaults.items():
            if not hasattr(cfg, key):
                continue
            reason = self.field_refusal(key, default, cfg)
            if reason is None:
                continue
            value = getattr(cfg, key)
            line = f'model.{key}={value!r} cannot be exported as --format={self.flag}: '
            line += reason.rstrip('.')
            for other in others:
                if other is not self and other.field_refusal(key, default, cfg) is None:
                    line += f'; --format={other.flag} writes {key}={value!r}'
            return line + '.'
        return None


class ExportError(ValueError):
    """A run that cannot be exported as asked; the message names the option and the fix."""


def max_length(ev: Any, max_len: int) -> int:
    """The longest sequence an export is sized for: the longest input the model was trained
    on (``max_len``, data.max_len) plus the paper's +50 (Sec. 6.1, ``ev.extra_length``), and
    the start token, which Hugging Face counts in max_length."""
    return int(max_len) + int(ev.extra_length) + 1
