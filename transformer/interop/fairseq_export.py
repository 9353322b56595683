"""The M2M100/NLLB-200 and mBART export: our parameters as their tensors (the table of
fairseq_params.py, inverted) in model.safetensors, and config.json and generation_config.json;
a converted directory's own values come back (`hf_config`), so its round trip gives back every
tensor and every config value. What each family's files hold of a model is declared once
(`WRITES`, transformer/formats.py); any other value is refused in one line before anything is
written. (Its tokenizer files are its vocabulary's to write.)
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformer.formats import (
    EVERY_VALUE,
    ExportError,
    Format,
    Writes,
    heads_of_d_model,
    one_kv_head_per_query,
)
from transformer.interop.fairseq_config import FAIRSEQ_IDS, SPECS
from transformer.interop.fairseq_params import state_dict_from_params
from transformer.interop.generation import CONFIG_FILE, GENERATION_FILE
from transformer.model import TransformerConfig, export_refusal

# config.json's values the export derives from the model (`hf_config`); a converted
# directory's other values are written back as it held them.
DERIVED_KEYS = (
    *('vocab_size', 'd_model', 'encoder_layers', 'decoder_layers', 'encoder_attention_heads'),
    *('decoder_attention_heads', 'encoder_ffn_dim', 'decoder_ffn_dim', 'activation_function'),
    *('scale_embedding', 'tie_word_embeddings', 'pad_token_id', 'eos_token_id'),
    *('decoder_start_token_id', 'dtype'),
)
# Where a model has no table to size it: M2M100 computes its sinusoids and grows the table
# for longer inputs; this is transformers' default size.
MAX_POSITIONS = 1024


# What both families' files hold: a LayerNorm before each sub-layer and one closing each
# stack, biased attention projections, one tied table, either embedding scale.
_BOTH = {
    'ffn': Writes(
        ('relu', 'gelu', 'swish'), 'their feed-forward has no gate, its activation named by ACT2FN'
    ),
    'norm': Writes(('layer_norm',), 'their norms are LayerNorms'),
    'pre_layer_norm': Writes((True,), 'they are pre-LN, a layer norm closing each stack'),
    'share_embeddings': Writes(('all',), 'their embeddings and output are one tied matrix'),
    'attention_bias': Writes((True,), 'their attention projections have biases'),
    'head_dim': heads_of_d_model('M2M100 or mBART'),
    'num_kv_heads': one_kv_head_per_query('M2M100 or mBART'),
    'scale_embedding': EVERY_VALUE,
}
WRITES = {
    'm2m100': Format(
        'hf',
        'M2M100',
        _BOTH
        | {
            'positions': Writes(('fairseq_sinusoidal',), "M2M100 computes fairseq's sinusoids"),
            'logits_bias': Writes((False,), 'M2M100 has no final_logits_bias'),
        },
    ),
    'mbart': Format(
        'hf',
        'mBART',
        _BOTH
        | {
            'positions': Writes(('bart_learned',), 'mBART has a learned position table'),
            'max_positions': EVERY_VALUE,  # its max_position_embeddings
            'layernorm_embedding': Writes((True,), 'mBART has a norm on each embedding sum'),
            'logits_bias': Writes((False, True)),  # final_logits_bias, zeros without
        },
    ),
}


def _spec(family: str):
    return next(spec for spec in SPECS.values() if spec.name == family)


def hf_config(
    cfg: TransformerConfig, family: str, source: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json of ``family`` ('m2m100', 'mbart') for ``cfg``: ``source`` (a converted
    directory's config.json as read) with the values derived from the model written over
    it (`DERIVED_KEYS`, and mBART's table size; equal for a converted run's), else a whole
    config of its own."""
    spec = _spec(family)
    model_type = next(t for t, s in SPECS.items() if s is spec)
    learned = cfg.positions == 'bart_learned'
    config = {
        'architectures': [spec.architecture],
        'model_type': model_type,
        'vocab_size': cfg.vocab_size,
        'd_model': cfg.d_model,
        'encoder_layers': cfg.num_encoder_layers,
        'decoder_layers': cfg.num_decoder_layers,
        'encoder_attention_heads': cfg.num_heads,
        'decoder_attention_heads': cfg.num_heads,
        'encoder_ffn_dim': cfg.d_ff,
        'decoder_ffn_dim': cfg.d_ff,
        'activation_function': cfg.ffn,  # ACT2FN's names of the exportable model.ffn
        'max_position_embeddings': cfg.max_positions if learned else MAX_POSITIONS,
        'scale_embedding': cfg.scale_embedding,
        'tie_word_embeddings': True,
        'dropout': cfg.dropout_rate,
        'attention_dropout': cfg.attention_dropout_rate,
        'activation_dropout': cfg.relu_dropout_rate,
        'bos_token_id': 0,
        'pad_token_id': FAIRSEQ_IDS.pad,
        'eos_token_id': FAIRSEQ_IDS.eos,
        'decoder_start_token_id': FAIRSEQ_IDS.decoder_start,
        'dtype': 'float32',
    }
    if source is None:
        return config
    keys = (*DERIVED_KEYS, 'max_position_embeddings') if learned else DERIVED_KEYS
    # A key the source leaves out stays out where transformers reads the model's value
    # without it (its config class's default), so a round trip gives the file back.
    derived = {
        key: config[key]
        for key in keys
        if key in source or config[key] != spec.defaults.get(key, object())
    }
    written = {**source, **derived}
    written.pop('torch_dtype', None)  # transformers' older name of dtype
    return written


def generation_config(beam_size: int, length_exponent: float, forced_eos: bool) -> dict[str, Any]:
    """generation_config.json of a model trained here: decoding from </s>, its beam size, its
    length penalty's exponent (Hugging Face's rule divides by length^x), EOS forced at the
    length limit where the run forces it."""
    generation = {
        'bos_token_id': 0,
        'pad_token_id': FAIRSEQ_IDS.pad,
        'eos_token_id': FAIRSEQ_IDS.eos,
        'decoder_start_token_id': FAIRSEQ_IDS.decoder_start,
        'num_beams': int(beam_size),
        'length_penalty': float(length_exponent),
    }
    if forced_eos:
        generation['forced_eos_token_id'] = FAIRSEQ_IDS.eos
    return generation


def write_model(
    directory: str,
    cfg: TransformerConfig,
    family: str,
    params: dict[str, Any],
    files: dict[str, dict[str, Any] | None] | None = None,
    generation: dict[str, Any] | None = None,
) -> None:
    """Writes model.safetensors, config.json and generation_config.json of ``family`` into
    the existing directory ``directory``.

    Args:
      cfg: the model's configuration.
      family: 'm2m100' or 'mbart'.
      params: our parameter tree (layers unstacked).
      files: a converted directory's config files as read (`FairseqModel.files`): their values
        come back, generation_config.json as it was (none where it had none).
      generation: generation_config.json of a model trained here (`generation_config`).

    Raises:
      ExportError: a model value the family's files cannot hold (`WRITES`), one line,
        before anything is written.
    """
    refusal = export_refusal(cfg, WRITES[family])
    if refusal:
        raise ExportError(refusal)
    from safetensors.numpy import save

    files = files or {}
    config = hf_config(cfg, family, files.get(CONFIG_FILE))
    if files:
        generation = files.get(GENERATION_FILE)
    # transformers refuses safetensors files whose metadata does not name a framework.
    weights = save(state_dict_from_params(params, cfg), metadata={'format': 'pt'})
    with open(os.path.join(directory, 'model.safetensors'), 'wb') as f:
        f.write(weights)
    _write_json(os.path.join(directory, CONFIG_FILE), config)
    if generation is not None:
        _write_json(os.path.join(directory, GENERATION_FILE), generation)


def _write_json(path: str, value: Any) -> None:
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write('\n')
