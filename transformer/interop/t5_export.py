"""A run as a ``T5ForConditionalGeneration`` directory (``export --format hf`` of a T5 run):
model.safetensors (t5_params.py's `state_dict_from_params`), config.json, generation_config.json
and the tokenizer files (t5_vocab.py).

What the files hold of a model is declared once, `WRITES`; any other value is refused in one
line before anything is written, and so is a feed-forward bias that is not zero (T5's ReLU
feed-forward has none; ours reads zeros, t5_params.py). A converted run writes its config files
back with the values derived from the model; the tensors come back as they were read, the
head of its own (``lm_head.weight``) too.
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
    one_kv_head_per_query,
)
from transformer.interop.generation import CONFIG_FILE, GENERATION_FILE
from transformer.interop.t5_params import nonzero_ffn_bias, state_dict_from_params
from transformer.interop.t5_vocab import T5Vocabulary
from transformer.model import export_refusal


def _tied_rescale(cfg: Any) -> str | None:
    if cfg.rescale_tied_head == (cfg.share_embeddings == 'all'):
        return None
    return (
        "T5 rescales a tied head's input and no head of its own: only rescale_tied_head="
        f'{cfg.share_embeddings == "all"} exports with share_embeddings={cfg.share_embeddings!r}.'
    )


WRITES = Format(
    'hf',
    'T5',
    {
        'ffn': Writes(
            ('relu', 'gelu', 'geglu_tanh', 'swiglu'),
            "T5's feed_forward_proj names relu, gelu, gated-gelu (tanh) and gated-silu",
        ),
        'norm': Writes(('rms_norm',), "T5's norms are RMSNorms"),
        'pre_layer_norm': Writes((True,), 'T5 is pre-LN, a norm closing each stack'),
        'share_embeddings': Writes(
            ('all', 'inputs'), 'T5 has one input table, the head tied to it or its own'
        ),
        'positions': Writes(('t5_relative',), "T5's positions are its relative buckets"),
        'scale_embedding': Writes((False,), 'T5 does not scale its embeddings'),
        'attention_scale': Writes((1.0,), "T5's attention logits are unscaled"),
        'head_dim': EVERY_VALUE,
        'num_kv_heads': one_kv_head_per_query('T5'),
        'relative_attention_num_buckets': EVERY_VALUE,
        'relative_attention_max_distance': EVERY_VALUE,
        'rescale_tied_head': Writes(check=_tied_rescale),
    },
)
FEED_FORWARD_PROJ = {
    'relu': 'relu',
    'gelu': 'gelu',
    'geglu_tanh': 'gated-gelu',
    'swiglu': 'gated-silu',
}
IDS = {'pad_token_id': 0, 'eos_token_id': 1, 'decoder_start_token_id': 0}


def hf_config(cfg: Any, source: dict[str, Any] | None) -> dict[str, Any]:
    """config.json of ``cfg``: the source's (a converted run's) with the values derived from
    the model written over it, or a whole one."""
    derived = {
        'vocab_size': cfg.vocab_size,
        'd_model': cfg.d_model,
        'd_kv': cfg.head_dim or cfg.d_model // cfg.num_heads,
        'd_ff': cfg.d_ff,
        'num_layers': cfg.num_encoder_layers,
        'num_decoder_layers': cfg.num_decoder_layers,
        'num_heads': cfg.num_heads,
        'relative_attention_num_buckets': cfg.relative_attention_num_buckets,
        'relative_attention_max_distance': cfg.relative_attention_max_distance,
        'layer_norm_epsilon': cfg.layer_norm_epsilon,
        'feed_forward_proj': FEED_FORWARD_PROJ[cfg.ffn],
        **IDS,
        'dtype': 'float32',
    }
    rescale = cfg.share_embeddings == 'all'
    if source and 'scale_decoder_outputs' in source:  # transformers 5's way of saying it
        derived |= {'scale_decoder_outputs': rescale, 'tie_word_embeddings': True}
    else:
        derived['tie_word_embeddings'] = rescale
    if source:
        written = {**source, **derived}
        written.pop('torch_dtype', None)  # transformers' older name of dtype
        return written
    return {
        'architectures': ['T5ForConditionalGeneration'],
        'model_type': 't5',
        'is_encoder_decoder': True,
        'dropout_rate': cfg.dropout_rate,
        **derived,
    }


def _write_json(path: str, value: Any) -> None:
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write('\n')


def write_hf(
    directory: str,
    cfg: Any,
    run_config: Any,
    tokenizer: Any,
    params: Any,
    source: dict[str, Any] | None = None,
    *,
    length_exponent: float,
) -> None:
    """`Family.write` of T5: model.safetensors, config.json, generation_config.json (a
    converted run's own where it had one) and the tokenizer files into the existing empty
    ``directory``; one-line `ExportError`s before anything is written."""
    refusal = export_refusal(cfg, WRITES)
    if refusal:
        raise ExportError(refusal)
    biased = nonzero_ffn_bias(params)
    if biased:
        raise ExportError(f"{biased} is not zero: T5's feed-forward has no biases to hold it.")
    if not isinstance(tokenizer, T5Vocabulary):
        raise ExportError(
            'The run holds no T5 vocabulary (spiece.model or tokenizer.json in vocab/): the '
            'export writes the one the model was converted with.'
        )
    from safetensors.numpy import save

    source = source or {}
    generation = source.get(GENERATION_FILE)
    if not source:
        ev = run_config.eval
        generation = {**IDS, 'num_beams': int(ev.beam_size)}
        generation['length_penalty'] = float(length_exponent)
        if ev.eos_at_limit == 'forced':
            generation['forced_eos_token_id'] = IDS['eos_token_id']
    sizes = {
        'vocab_size': cfg.vocab_size,
        'd_model': cfg.d_model,
        'head_dim': cfg.head_dim or cfg.d_model // cfg.num_heads,
        'num_heads': cfg.num_heads,
        'num_encoder_layers': cfg.num_encoder_layers,
        'num_decoder_layers': cfg.num_decoder_layers,
    }
    weights = save(state_dict_from_params(params, sizes), metadata={'format': 'pt'})
    with open(os.path.join(directory, 'model.safetensors'), 'wb') as f:
        f.write(weights)
    _write_json(os.path.join(directory, CONFIG_FILE), hf_config(cfg, source.get(CONFIG_FILE)))
    if generation is not None:
        _write_json(os.path.join(directory, GENERATION_FILE), generation)
    tokenizer.copy_to(directory)
