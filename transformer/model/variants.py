"""The model's variants, one entry each: every choice of what the network computes.

A `Variant` is one value of one part of the network (its attention, feed-forward, kind of
normalization, where the norms sit, a norm on the embeddings, embedding sharing, a bias on
the logits, how positions enter) and declares, in one place, what the rest of the package
reads:

* ``weights``: the shapes of one instance's parameters, by their path below it
  ('wi/kernel' -> (D, F)); ``outer``: the parameters it adds outside the layers (pre-LN's
  final norms, the embeddings, a learned position table). `param_shapes` places them in the
  model's tree, and from it follow the parameter count (`param_count`), the layers' weight
  memory (transformer/training/footprint.py, `layer_param_count`) and the matmul FLOPs per
  token (transformer/model/flops.py, `matmul_flops_per_token`).
* ``module``: the Flax module that computes it, where the part has one per entry (the
  feed-forward, the norm: ``module(config, name=...)``), or the object the network calls (the
  positions: transformer/model/positions.py); None where the Transformer reads the field
  itself (norm placement, embedding sharing) or its output head does (embedding sharing, the
  logits' bias: transformer/model/output_head.py).
* ``check``: why a config cannot build it (rotary positions with an odd head size), or None;
  `check` runs every chosen entry's when the config is made.

Each part (`PARTS`) is chosen by one config field, declared here with its default and
description: TransformerConfig's line for it is ``name: type = variants.config_field(part)``,
and the field's accepted values, its --help choices and its bad-value error are the entries
registered for the part (`choices`), read when they are checked or printed. A new variant is
a `register` call beside its module: its config value, --help line, bad-value error, old-run
default and resume refusal follow from the field, its FLOPs, memory and parameter count from
``weights``. An export writes it only once the format declares it (transformer/formats.py:
each format names the values it writes, and refuses every other, `export_refusal`), so a new
entry is refused by every export until its writer maps it. transformer/model/__init__.py
imports every module that registers entries (feed_forward.py, norms.py, positions.py), so all
of them exist once the package is imported. docs/model_variants.md walks through adding one.

A number that changes the network (a head count, the head size) is no entry but a numeric
setting, declared in transformer/model/settings.py: the shapes it sets in a part's entry are
laid over the entry's own (`weights`); the exports declare the values they write of it too.

Shape legend (transformer/model/attention.py): D d_model · N heads · H head dim · F d_ff ·
V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from transformer import fields
from transformer.formats import Format
from transformer.model import settings

# A TransformerConfig (transformer/model/config.py), which reads this module for its fields'
# choices: named here by its fields alone.
TransformerConfig = Any
Shape = tuple[int, ...]
Shapes = dict[str, Shape]


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the network and the config field that chooses it.

    Attributes:
      field: the TransformerConfig field; None: the part has one entry and no field yet (a
        second attention adds one here and a line ``attention: str =
        variants.config_field('attention')`` to TransformerConfig).
      default: the field's default, the value of runs written before the field existed.
      doc: what the field chooses (--help adds the registered values).
    """

    field: str | None
    default: Any = None
    doc: str = ''


PARTS = {
    'attention': Part(None),
    'ffn': Part('ffn', 'relu', "the feed-forward; 'relu': Sec. 3.3"),
    'norm': Part('norm', 'layer_norm', "the sub-layers' norm; 'layer_norm': Sec. 3.1"),
    'norm_placement': Part('pre_layer_norm', False, 'False: post-LN (Sec. 3.1); True: pre-LN'),
    'embedding_norm': Part(
        'layernorm_embedding', False, "a norm on each stack's embedding sum (mBART's)"
    ),
    'embeddings': Part('share_embeddings', 'all', "'all': all three share one (Sec. 3.4)"),
    'logits_bias': Part(
        'logits_bias',
        False,
        "a [V] bias on the logits (MarianMT's final_logits_bias); not Sec. 3.4's",
    ),
    # Short: the registered values follow it on the one --help line ('sinusoidal': Sec. 3.5).
    'positions': Part('positions', 'sinusoidal', 'how they enter'),
}
# The config field that chooses each part.
FIELDS: dict[str, str | None] = {part: p.field for part, p in PARTS.items()}
# The sub-layers of each stack's layers and the part each one is (Sec. 3.1); each is wrapped
# in a residual connection and a layer norm named '{sub-layer}_norm' (transformer/model/layers.py).
SUBLAYERS = {
    'encoder': {'self_attention': 'attention', 'ffn': 'ffn'},
    'decoder': {'self_attention': 'attention', 'cross_attention': 'attention', 'ffn': 'ffn'},
}


def nothing(cfg: TransformerConfig) -> Shapes:
    del cfg
    return {}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One value of one part of the network; see the module docstring.

    Attributes:
      part: one of `FIELDS`.
      value: the value of the part's config field that chooses it.
      weights: one instance's parameter shapes, by path below it ({} for none).
      source: the paper section or code it follows.
      module: the Flax module ``module(config, name=...)`` that computes it (the feed-forward,
        the norm), the object the network calls (positions: a `positions.PositionEncoding`),
        or None where the Transformer reads the field itself.
      outer: the parameters it adds outside the layers, by path from the model's root.
      check: (cfg) -> why ``cfg`` cannot build it (one line naming the field to fix), or None.
    """

    part: str
    value: Any
    weights: Callable[[TransformerConfig], Shapes]
    source: str
    module: Any = None
    outer: Callable[[TransformerConfig], Shapes] = nothing
    check: Callable[[TransformerConfig], str | None] = lambda cfg: None


_REGISTRY: dict[str, dict[Any, Variant]] = {part: {} for part in FIELDS}


def register(variant: Variant) -> Variant:
    """Adds ``variant``; returns it. A value its part already has is refused (one line):
    replacing an entry would change every run that chose it."""
    if variant.part not in _REGISTRY:
        raise ValueError(f'part {variant.part!r} is not one of {", ".join(FIELDS)}.')
    if variant.value in _REGISTRY[variant.part]:
        raise ValueError(
            f'the {variant.part} {variant.value!r} is registered already '
            f'({_REGISTRY[variant.part][variant.value].source}); register it under a new name.'
        )
    _REGISTRY[variant.part][variant.value] = variant
    return variant


def unregister(part: str, value: Any) -> None:
    """Removes the entry of ``part`` and ``value``."""
    del _REGISTRY[part][value]


def choices(part: str) -> tuple[Any, ...]:
    """The values registered for ``part``, in the order they were registered."""
    return tuple(_REGISTRY[part])


class _Choices:
    """What a part's field accepts, as its error says it (read when the error is written)."""

    def __init__(self, part: str):
        self.part = part

    def __str__(self) -> str:
        return 'one of ' + ', '.join(map(repr, choices(self.part)))


def rule(part: str) -> dict[str, Any]:
    """The field rule of ``part``'s config field: one of the registered values."""
    return {'rule': (lambda value: value in _REGISTRY[part], _Choices(part))}


class _Doc:
    """A part's field description as --help prints it, with the values registered then."""

    def __init__(self, part: str):
        self.part = part

    def __str__(self) -> str:
        return f'{PARTS[self.part].doc} ({_Choices(self.part)})'


def config_field(part: str) -> Any:
    """The TransformerConfig field that chooses ``part``: its default, its rule (a
    registered value) and its description; optional (config.json of an earlier run)."""
    return fields.field(PARTS[part].default, rule(part), doc=_Doc(part), optional=True)


def chosen(cfg: TransformerConfig, part: str) -> Variant:
    """The entry ``cfg`` chooses for ``part``."""
    field = FIELDS[part]
    if field is None:
        (variant,) = _REGISTRY[part].values()
        return variant
    return _REGISTRY[part][getattr(cfg, field)]


def check(cfg: TransformerConfig) -> str | None:
    """Why ``cfg`` cannot build one of the entries it chooses (the first such), or None."""
    for part in FIELDS:
        problem = chosen(cfg, part).check(cfg)
        if problem:
            return problem
    return None


def weights(cfg: TransformerConfig, part: str) -> Shapes:
    """One instance of ``part``'s parameter shapes by path: its entry's, with the shapes the
    numeric settings set (transformer/model/settings.py: the heads, the head size)."""
    return chosen(cfg, part).weights(cfg) | settings.weights(cfg, part)


def layer_shapes(cfg: TransformerConfig, stack: str) -> Shapes:
    """One layer of ``stack`` ('encoder', 'decoder'): its parameters' shapes by path."""
    norm = weights(cfg, 'norm')
    shapes = {}
    for sublayer, part in SUBLAYERS[stack].items():
        shapes |= {f'{sublayer}/{k}': s for k, s in weights(cfg, part).items()}
        shapes |= {f'{sublayer}_norm/{k}': s for k, s in norm.items()}
    return shapes


def param_shapes(cfg: TransformerConfig) -> Shapes:
    """Every parameter of the model, by its '/'-joined path in the parameter tree."""
    shapes = {}
    for stack in SUBLAYERS:
        layer = layer_shapes(cfg, stack)
        for i in range(getattr(cfg, f'num_{stack}_layers')):
            shapes |= {f'{stack}_layer_{i}/{k}': s for k, s in layer.items()}
    for part in FIELDS:
        shapes |= chosen(cfg, part).outer(cfg)
    return shapes


def param_count(cfg: TransformerConfig) -> int:
    """The model's parameters."""
    return sum(math.prod(shape) for shape in param_shapes(cfg).values())


def layer_param_count(cfg: TransformerConfig) -> int:
    """The parameters of the encoder's and decoder's layers: the model's without the
    embeddings and what else lies outside the layers."""
    return sum(
        math.prod(shape) * getattr(cfg, f'num_{stack}_layers')
        for stack in SUBLAYERS
        for shape in layer_shapes(cfg, stack).values()
    )


def matmul_flops_per_token(
    cfg: TransformerConfig, part: str, names: tuple[str, ...] | None = None
) -> int:
    """Forward FLOPs (2 per multiply-add) that one instance of ``part`` spends per token on
    its weight products: every weight of two or more axes but a bias multiplies each token's
    vector once (biases, the attention's [N, H] ones too, and norm scales are not products).
    ``names``: only the weights below these (the attention's 'key' and 'value', which read the
    keys' tokens)."""
    return 2 * sum(
        math.prod(shape)
        for path, shape in weights(cfg, part).items()
        if len(shape) > 1
        and path.split('/')[-1] != 'bias'
        and (names is None or path.split('/')[0] in names)
    )


def describe(cfg: TransformerConfig) -> str:
    """The variants ``cfg`` chooses, as config values: "ffn='relu', pre_layer_norm=False, ..."."""
    return ', '.join(f'{f}={getattr(cfg, f)!r}' for f in FIELDS.values() if f is not None)


def model_fields() -> dict[str, Any]:
    """{field: default} of every variant field and numeric setting (transformer/model/
    settings.py): the fields an export format declares the values it writes of."""
    parts = {p.field: p.default for p in PARTS.values() if p.field is not None}
    return parts | {s.field: s.default for s in settings.declared()}


def export_refusal(
    cfg: TransformerConfig, format: Format, others: tuple[Format, ...] = ()
) -> str | None:
    """One line for the first variant field or numeric setting whose value in ``cfg``
    ``format`` does not write (its declaration: transformer/formats.py), naming those of
    ``others`` that write it; None if it writes them all."""
    return format.refusal(cfg, model_fields(), others)


# The entries of the paper's network and of the choices that need no module of their own.
def _heads(cfg: TransformerConfig) -> tuple[int, int]:
    return cfg.num_heads, cfg.d_model // cfg.num_heads


register(
    Variant(
        'attention',
        'multi_head',
        # q, k, v kernels [D, N, H] and the output kernel [N, H, D], no biases, H = D / N; the
        # numeric settings model.head_dim and model.num_kv_heads set H and the keys' and
        # values' heads K (transformer/model/settings.py).
        lambda cfg: {
            **{f'{n}/kernel': (cfg.d_model, *_heads(cfg)) for n in ('query', 'key', 'value')},
            'out/kernel': (*_heads(cfg), cfg.d_model),
        },
        'Sec. 3.2.2; transformer/model/attention.py, projections.py',
    )
)
# One norm's weights: those of the kind ``model.norm`` chooses (transformer/model/norms.py).
_NORM = lambda cfg: chosen(cfg, 'norm').weights(cfg)  # noqa: E731
register(Variant('norm_placement', False, nothing, 'post-LN, Sec. 3.1: Norm(x + Sublayer(x))'))
register(
    Variant(
        'norm_placement',
        True,
        nothing,
        "pre-LN, tensor2tensor's later default: x + Sublayer(Norm(x)), final norms",
        outer=lambda cfg: {
            f'{stack}_norm/{k}': s for stack in SUBLAYERS for k, s in _NORM(cfg).items()
        },
    )
)
register(Variant('embedding_norm', False, nothing, 'Sec. 3.4: the embedding sum is dropped out'))
register(
    Variant(
        'embedding_norm',
        True,
        nothing,
        "fairseq's layernorm_embedding (mBART): Norm(embeddings + positions), then dropout",
        outer=lambda cfg: {
            f'{stack}_embedding_norm/{k}': s for stack in SUBLAYERS for k, s in _NORM(cfg).items()
        },
    )
)
_TABLE = lambda cfg: (cfg.vocab_size, cfg.d_model)  # noqa: E731
register(
    Variant(
        'embeddings',
        'all',
        nothing,
        'Sec. 3.4: source, target and pre-softmax share one matrix',
        outer=lambda cfg: {'shared_embedding/embedding': _TABLE(cfg)},
    )
)
register(
    Variant(
        'embeddings',
        'target',
        nothing,
        'the target embedding is the pre-softmax matrix; the source has its own',
        outer=lambda cfg: {f'{s}_embedding/embedding': _TABLE(cfg) for s in ('source', 'target')},
    )
)
# A head's own pre-softmax matrix, untied from the embeddings (transformer/model/output_head.py).
_HEAD = lambda cfg: {'logits_dense/kernel': (cfg.d_model, cfg.vocab_size)}  # noqa: E731
register(
    Variant(
        'embeddings',
        'none',
        nothing,
        'three separate matrices',
        outer=lambda cfg: {
            **{f'{s}_embedding/embedding': _TABLE(cfg) for s in ('source', 'target')},
            **_HEAD(cfg),
        },
    )
)
register(
    Variant(
        'embeddings',
        'inputs',
        nothing,
        "source and target share one matrix, the pre-softmax its own (T5 v1.1's, untied)",
        outer=lambda cfg: {'shared_embedding/embedding': _TABLE(cfg), **_HEAD(cfg)},
    )
)

register(Variant('logits_bias', False, nothing, 'Sec. 3.4: logits = y E^T, no bias'))
register(
    Variant(
        'logits_bias',
        True,
        nothing,
        "Hugging Face MarianMT's final_logits_bias: logits = y E^T + b, b a fixed buffer there",
        # [V], in the rows' order of the embedding (transformer/model/output_head.py).
        outer=lambda cfg: {'logits_bias': (cfg.vocab_size,)},
    )
)
