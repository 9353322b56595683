"""The model's numeric settings, one declaration each: what a number (a head count, a width)
or a switch (the attention's biases) changes in the network and what the PyTorch peer can
represent of it.

A part's choice is one entry of transformer/model/variants.py; a numeric setting has no entry
per value, so its `Setting` declares, in one place, what the rest of the package reads:

* the config field (TransformerConfig's line is ``name: type = settings.config_field(name)``):
  its default (the value of runs written before the field existed), rule and description,
  which --help prints;
* ``weights``: the parameter shapes it sets in a part's entry, by part and path
  ({'attention': {'key/kernel': (D, K, H)}}), over the entry's own: `variants.param_shapes`
  places them in the model's tree, and from there follow the parameter count, the FLOPs
  (transformer/model/flops.py) and the layers' weight memory (transformer/training/footprint.py);
* ``unbuilt``: why the PyTorch peer (benchmarks/torch_peer.py) does not build it, or None
  where it does (`peer_refusal`).

A resume that changes a setting is refused, as every ``model.*`` field's change is
(transformer/rundir.py). What each export format writes of a setting is the format's own
declaration (transformer/formats.py): a setting it does not name exports at its default
only. docs/model_variants.md walks through adding one.

Shape legend (transformer/model/attention.py): D d_model · N heads · K key/value heads ·
H head dim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from transformer import fields

TransformerConfig = Any  # transformer/model/config.py's, which reads this module
Shapes = dict[str, tuple[int, ...]]


def _none(cfg: TransformerConfig) -> str | None:
    del cfg
    return None


@dataclasses.dataclass(frozen=True)
class Setting:
    """One numeric model setting; see the module docstring.

    Attributes:
      field: the TransformerConfig field.
      default: its default, the value of runs written before it existed.
      doc: its one-line description (--help prints it).
      rule: its rule (transformer/fields.py: POSITIVE, POSITIVE_OR_NONE, ...).
      weights: (cfg) -> {part: {path: shape}}, the shapes it sets in each part's entry.
      unbuilt: (cfg) -> why the PyTorch peer does not build ``cfg``'s value, or None.
    """

    field: str
    default: Any
    doc: str
    rule: dict[str, Any]
    weights: Callable[[TransformerConfig], dict[str, Shapes]]
    unbuilt: Callable[[TransformerConfig], str | None] = _none


_SETTINGS: dict[str, Setting] = {}


def declare(setting: Setting) -> Setting:
    """Adds ``setting`` (or replaces the declaration of its field); returns it."""
    _SETTINGS[setting.field] = setting
    return setting


def undeclare(field: str) -> None:
    """Removes the declaration of ``field``."""
    del _SETTINGS[field]


def declared() -> tuple[Setting, ...]:
    """The declared settings, in the order they were declared."""
    return tuple(_SETTINGS.values())


def config_field(name: str) -> Any:
    """The TransformerConfig field of the setting ``name``: its default, rule and description;
    optional (config.json of an earlier run)."""
    setting = _SETTINGS[name]
    return fields.field(setting.default, setting.rule, doc=setting.doc, optional=True)


def weights(cfg: TransformerConfig, part: str) -> Shapes:
    """The shapes the declared settings set in ``part``'s entry, by path below it."""
    shapes: Shapes = {}
    for setting in _SETTINGS.values():
        if hasattr(cfg, setting.field):  # a config of a program that lacks the field
            shapes |= setting.weights(cfg).get(part, {})
    return shapes


def peer_refusal(cfg: TransformerConfig) -> str | None:
    """One line for the first setting whose value in ``cfg`` (a TransformerConfig or the
    config's model section) the PyTorch peer does not build."""
    for setting in _SETTINGS.values():
        if not hasattr(cfg, setting.field):
            continue
        reason = setting.unbuilt(cfg)
        if reason:
            value = getattr(cfg, setting.field)
            return f'model.{setting.field}={value!r} is not built by the PyTorch peer: {reason}'
    return None


# The settings of the attention's shapes (Sec. 3.2.2).
def head_dim(cfg: TransformerConfig) -> int:
    """H = d_k = d_v: model.head_dim, or d_model / num_heads (Sec. 3.2.2)."""
    return cfg.head_dim or cfg.d_model // cfg.num_heads


def num_kv_heads(cfg: TransformerConfig) -> int:
    """K, the key/value heads: model.num_kv_heads, or num_heads (the paper's)."""
    return getattr(cfg, 'num_kv_heads', None) or cfg.num_heads


def _key_value(cfg: TransformerConfig) -> tuple[int, int, int]:
    """The key and value kernels' shape: [D, K, H]."""
    return cfg.d_model, num_kv_heads(cfg), head_dim(cfg)


declare(
    Setting(
        'head_dim',
        None,
        'H = d_k = d_v; None = d_model // num_heads (Sec. 3.2.2)',
        fields.POSITIVE_OR_NONE,
        lambda cfg: {
            'attention': {
                'query/kernel': (cfg.d_model, cfg.num_heads, head_dim(cfg)),
                **{f'{n}/kernel': _key_value(cfg) for n in ('key', 'value')},
                'out/kernel': (cfg.num_heads, head_dim(cfg), cfg.d_model),
            }
        },
    )
)
declare(
    Setting(
        'num_kv_heads',
        None,
        'K, key/value heads, a divisor of N (grouped-query attention); None = N',
        fields.POSITIVE_OR_NONE,
        lambda cfg: {'attention': {f'{n}/kernel': _key_value(cfg) for n in ('key', 'value')}},
    )
)


# A switch of the attention's shapes: Hugging Face MarianMT (OPUS-MT) has biases on the four
# projections; the paper's equations (Sec. 3.2.2) have none.
def _attention_biases(cfg: TransformerConfig) -> dict[str, Shapes]:
    """The biases MultiHeadAttention(use_bias=True) makes (transformer/model/projections.py):
    query [N, H], key and value [K, H], out [D]."""
    if not cfg.attention_bias:
        return {}
    key_value = (num_kv_heads(cfg), head_dim(cfg))
    return {
        'attention': {
            'query/bias': (cfg.num_heads, head_dim(cfg)),
            **{f'{n}/bias': key_value for n in ('key', 'value')},
            'out/bias': (cfg.d_model,),
        }
    }


declare(
    Setting(
        'attention_bias',
        False,
        "biases on the attention's q, k, v and output projections (MarianMT's; not the paper's)",
        fields.BOOL,
        _attention_biases,
    )
)


# A switch of the attention's computation: QK-norm (Dehghani et al., 2023, "Scaling Vision
# Transformers to 22 Billion Parameters"; OLMo 2, Gemma 3), an RMSNorm over each head's H
# channels of the queries and the keys before their product (transformer/model/attention.py).
def _qk_norm_scales(cfg: TransformerConfig) -> dict[str, Shapes]:
    """The two RMSNorm scales [H] each attention has with ``model.qk_norm``."""
    if not cfg.qk_norm:
        return {}
    return {'attention': {f'{n}_norm/scale': (head_dim(cfg),) for n in ('query', 'key')}}


def _peer_qk_norm(cfg: TransformerConfig) -> str | None:
    return 'the peer has no norm on queries and keys.' if cfg.qk_norm else None


declare(
    Setting(
        'qk_norm',
        False,
        "an RMSNorm on each head's queries and keys before their product (QK-norm)",
        fields.BOOL,
        _qk_norm_scales,
        unbuilt=_peer_qk_norm,
    )
)


# The factor on the attention logits q k^T (transformer/model/dot_product.py): the paper's
# 1/sqrt(H) (Sec. 3.2.1), or another, as T5's 1.0 (its initialization scales the queries
# instead).
def _peer_scale(cfg: TransformerConfig) -> str | None:
    if cfg.attention_scale is None:
        return None
    return 'the peer scales the logits by 1/sqrt(head_dim) only.'


declare(
    Setting(
        'attention_scale',
        None,
        'factor on the attention logits; None = 1/sqrt(head_dim) (Sec. 3.2.1); T5: 1.0',
        fields.ABOVE_ZERO,
        lambda cfg: {},
        unbuilt=_peer_scale,
    )
)


# Sec. 3.4 multiplies the embeddings by sqrt(d_model); fairseq's models make it a switch
# (``scale_embedding`` of Hugging Face's M2M100Config and MBartConfig), off in some of them.
def _peer_scale_embedding(cfg: TransformerConfig) -> str | None:
    return None if cfg.scale_embedding else 'the peer scales the embeddings by sqrt(d_model).'


declare(
    Setting(
        'scale_embedding',
        True,
        'embeddings multiplied by sqrt(d_model) (Sec. 3.4); False: as they are',
        fields.BOOL,
        lambda cfg: {},
        unbuilt=_peer_scale_embedding,
    )
)


# The rows of a learned position table (model.positions='bart_learned', transformer/model/
# positions.py), Hugging Face's max_position_embeddings; the sinusoids need none.
declare(
    Setting(
        'max_positions',
        None,
        "positions a learned table holds (model.positions='bart_learned'); None: no table",
        fields.POSITIVE_OR_NONE,
        lambda cfg: {},
    )
)


# The sizes of T5's relative position buckets (model.positions='t5_relative',
# transformer/model/relative_positions.py): Hugging Face T5Config's
# relative_attention_num_buckets and relative_attention_max_distance, whose defaults these are.
declare(
    Setting(
        'relative_attention_num_buckets',
        32,
        "relative position buckets of model.positions='t5_relative' (T5Config's)",
        fields.POSITIVE,
        lambda cfg: {},
    )
)
declare(
    Setting(
        'relative_attention_max_distance',
        128,
        "the distance from which T5's buckets are all one (T5Config's)",
        fields.POSITIVE,
        lambda cfg: {},
    )
)


# T5 v1.0 ties its output head to the embedding and multiplies the decoder's last hidden
# states by d_model^-0.5 before it (Hugging Face's T5ForConditionalGeneration where
# tie_word_embeddings); transformer/model/output_head.py.
def _peer_rescale(cfg: TransformerConfig) -> str | None:
    return 'the peer does not rescale the hidden states.' if cfg.rescale_tied_head else None


declare(
    Setting(
        'rescale_tied_head',
        False,
        'a tied output head reads the hidden states times d_model^-0.5 (T5 v1.0)',
        fields.BOOL,
        lambda cfg: {},
        unbuilt=_peer_rescale,
    )
)
