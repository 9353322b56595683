"""The ``model`` section of an M2M100/NLLB-200 or mBART config.json (`model_settings`), its
refusals (`check_expressible`) and fairseq's special ids (`FAIRSEQ_IDS`, `check_special_ids`).

Both families are this project's Transformer with options (transformer/model/variants.py,
settings.py), as transformers 5's modeling_m2m_100.py and modeling_mbart.py compute them:
pre-LN with a final layer norm closing each stack, biased attention projections, torch's layer
norm epsilon 1e-5, one embedding table for source, target and output (``tie_word_embeddings``),
embeddings scaled by sqrt(d_model) or not (``scale_embedding``, either way), and fairseq's
dictionary ids as they are (`FAIRSEQ_IDS`: no permutation). M2M100: fairseq's sinusoids,
computed ('fairseq_sinusoidal'), and no output bias. mBART: a learned position table
('bart_learned', max_position_embeddings rows after two unread ones), a layer norm on each
stack's embedding sum (``layernorm_embedding``) and ``final_logits_bias``
(``model.logits_bias``). What a config says that this model cannot compute stops in one
`FairseqError` naming the key; keys transformers ignores at inference (``*_layerdrop``,
``init_std``, ``use_cache``, ...) are ignored here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer.interop.fairseq_params import FairseqError
from transformer.tokens import SpecialIds

# fairseq's dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3; the decoder starts from </s>.
FAIRSEQ_IDS = SpecialIds(pad=1, eos=2, unk=3, decoder_start=2, never_emit=(1,))
# Hugging Face's activation names -> model.ffn (ACT2FN: 'silu' and 'swish' are one function;
# 'gelu' is the exact, erf one, as ours).
ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'swish': 'swish', 'silu': 'swish'}
LAYER_NORM_EPSILON = 1e-5  # torch's nn.LayerNorm default, which both families use
# NLLB-MoE's keys (NllbMoeConfig): expert layers this model has no counterpart of.
MOE_KEYS = ('num_experts', 'expert_capacity', 'encoder_sparse_step', 'decoder_sparse_step')


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """What differs between the two families.

    Attributes:
      name: its name in messages and converted_from.json ('m2m100', 'mbart').
      title: its models' name in messages.
      architecture: config.json's ``architectures`` entry of its translation model.
      defaults: transformers 5's config class defaults of the keys read here (a key
        config.json leaves out is the class's, as transformers reads it).
      options: the model section's values that make our model the family's network.
    """

    name: str
    title: str
    architecture: str
    defaults: dict[str, Any]
    options: dict[str, Any]


_SHAPE_DEFAULTS = dict(
    vocab_size=None,
    d_model=1024,
    encoder_layers=12,
    decoder_layers=12,
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    encoder_ffn_dim=4096,
    decoder_ffn_dim=4096,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
    dropout=0.1,
    activation_dropout=0.0,
    pad_token_id=1,
    eos_token_id=2,
)
# The keys of sizes (whole numbers > 0), by how their names end.
SIZE_KEYS = ('_size', 'd_model', '_layers', '_heads', '_dim', 'position_embeddings')
SPECS = {
    'm2m_100': FamilySpec(
        'm2m100',
        'M2M100',
        'M2M100ForConditionalGeneration',
        {**_SHAPE_DEFAULTS, 'vocab_size': 128112, 'activation_function': 'relu'}
        | {'scale_embedding': True, 'attention_dropout': 0.1, 'decoder_start_token_id': 2},
        {'positions': 'fairseq_sinusoidal', 'logits_bias': False},
    ),
    'mbart': FamilySpec(
        'mbart',
        'mBART',
        'MBartForConditionalGeneration',
        {**_SHAPE_DEFAULTS, 'vocab_size': 50265, 'activation_function': 'gelu'}
        | {'scale_embedding': False, 'attention_dropout': 0.0, 'decoder_start_token_id': None}
        | {'forced_eos_token_id': 2},
        {'positions': 'bart_learned', 'logits_bias': True, 'layernorm_embedding': True},
    ),
}


def spec_of(hf: dict[str, Any], file: str) -> FamilySpec:
    """The family of a config.json (``hf``, read from ``file``) by its model_type."""
    model_type = hf.get('model_type')
    if model_type == 'nllb-moe':
        raise FairseqError(
            f"{file}: model_type='nllb-moe' is not handled: NLLB-MoE's expert layers have no "
            "counterpart here; the dense NLLB-200 models (model_type 'm2m_100') are read."
        )
    if model_type not in SPECS:
        raise FairseqError(
            f"{file}: model_type={model_type!r} is neither M2M100/NLLB-200 ('m2m_100') nor "
            "mBART ('mbart')."
        )
    return SPECS[model_type]


def config_value(hf: dict[str, Any], spec: FamilySpec, key: str) -> Any:
    """config.json's value of ``key``, or its config class's default, as transformers reads
    it."""
    return hf.get(key, spec.defaults.get(key))


def _check_numbers(hf: dict[str, Any], spec: FamilySpec, file: str) -> None:
    """A `FairseqError` naming the first shape key that is not a whole number > 0, and
    d_model that its heads do not divide."""
    for key in (k for k in _SHAPE_DEFAULTS if k.endswith(SIZE_KEYS)):
        value = config_value(hf, spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FairseqError(f'{file}: {key}={value!r} is not a whole number > 0.')
    d_model, heads = (
        config_value(hf, spec, 'd_model'),
        config_value(hf, spec, 'encoder_attention_heads'),
    )
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 4 or d_model % heads:
        raise FairseqError(
            f'{file}: d_model={d_model!r} must be a whole number >= 4 and a multiple of '
            f'encoder_attention_heads={heads}.'
        )


def check_expressible(hf: dict[str, Any], file: str) -> FamilySpec:
    """The family of an M2M100/NLLB-200 or mBART config.json (``hf``, read from ``file``),
    or a `FairseqError` naming the first key whose value this model cannot express."""
    spec = spec_of(hf, file)

    def refuse(key: str, why: str) -> FairseqError:
        return FairseqError(f'{file}: {key}={config_value(hf, spec, key)!r} {why}')

    for key in (*MOE_KEYS, *(k for k in hf if k.startswith(('router_', 'moe_')))):
        if key in hf:
            raise refuse(key, "is NLLB-MoE's (expert layers), which is not handled here.")
    _check_numbers(hf, spec, file)
    for ours, encoder, decoder in (
        ('num_heads', 'encoder_attention_heads', 'decoder_attention_heads'),
        ('d_ff', 'encoder_ffn_dim', 'decoder_ffn_dim'),
    ):
        if config_value(hf, spec, encoder) != config_value(hf, spec, decoder):
            raise refuse(
                decoder,
                f'differs from {encoder}={config_value(hf, spec, encoder)!r}: one '
                f'model.{ours} serves both stacks.',
            )
    if config_value(hf, spec, 'activation_function') not in ACTIVATIONS:
        raise refuse('activation_function', f'is not one of {", ".join(ACTIVATIONS)}.')
    if config_value(hf, spec, 'tie_word_embeddings') is not True:
        raise refuse(
            'tie_word_embeddings',
            'is not expressible: the output projection is the embedding (Sec. 3.4).',
        )
    if not isinstance(config_value(hf, spec, 'scale_embedding'), bool):
        raise refuse('scale_embedding', 'is not true or false.')
    for key in ('normalize_before', 'add_final_layer_norm', 'normalize_embedding'):
        # transformers' MBart computes pre-LN, a final norm on each stack and a norm on each
        # embedding sum whatever these say (mBART-50's say true): a directory saying
        # otherwise was made for another network.
        if spec.name == 'mbart' and hf.get(key, True) is not True:
            raise refuse(
                key,
                "is not mBART-50's true: transformers' MBart (and this model) computes pre-LN "
                'with a final layer norm on each stack and a norm on each embedding sum, so '
                'these weights were made for another network.',
            )
    return spec


def _rate(hf: dict[str, Any], spec: FamilySpec, key: str, file: str) -> float:
    value = config_value(hf, spec, key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise FairseqError(f'{file}: {key}={value!r} is not a rate in [0, 1).')
    return float(value)


def model_settings(hf: dict[str, Any], file: str) -> dict[str, Any]:
    """The ``model`` section of an M2M100/NLLB-200 or mBART config.json (``hf``; ``file``
    names it in errors), each value read from its key (`check_expressible` first)."""
    spec = check_expressible(hf, file)
    model = {
        'd_model': config_value(hf, spec, 'd_model'),
        'num_heads': config_value(hf, spec, 'encoder_attention_heads'),
        'd_ff': config_value(hf, spec, 'encoder_ffn_dim'),
        'num_encoder_layers': config_value(hf, spec, 'encoder_layers'),
        'num_decoder_layers': config_value(hf, spec, 'decoder_layers'),
        'ffn': ACTIVATIONS[config_value(hf, spec, 'activation_function')],
        'scale_embedding': config_value(hf, spec, 'scale_embedding'),
        'dropout_rate': _rate(hf, spec, 'dropout', file),
        'attention_dropout_rate': _rate(hf, spec, 'attention_dropout', file),
        'relu_dropout_rate': _rate(hf, spec, 'activation_dropout', file),
        'attention_bias': True,
        'pre_layer_norm': True,
        'layer_norm_epsilon': LAYER_NORM_EPSILON,
        'share_embeddings': 'all',
        **spec.options,
    }
    if spec.options['positions'] == 'bart_learned':
        model['max_positions'] = config_value(hf, spec, 'max_position_embeddings')
    return model


def check_special_ids(keys: dict[str, Any], file: str) -> None:
    """A `FairseqError` naming the first special id of config.json or generation_config.json
    (``keys``, read from ``file``) that is not fairseq's dictionary's (`FAIRSEQ_IDS`); a key
    left out or null is not checked here."""
    wanted = {
        'pad_token_id': (FAIRSEQ_IDS.pad, "fairseq's <pad>"),
        'eos_token_id': (FAIRSEQ_IDS.eos, "fairseq's </s>"),
        'forced_eos_token_id': (FAIRSEQ_IDS.eos, "fairseq's </s>, forced at the length limit"),
        'decoder_start_token_id': (FAIRSEQ_IDS.decoder_start, "fairseq's </s>"),
    }
    for key, (want, what) in wanted.items():
        value = keys.get(key)
        if value is not None and value != want:
            raise FairseqError(f'{file}: {key}={value!r} is not {want!r} ({what}).')
