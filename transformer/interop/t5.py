"""The T5 family (``T5ForConditionalGeneration``: T5 v1.0, T5 v1.1, MADLAD-400): its
directories read as this project's models, config.json mapped onto the ``model`` section
(`model_settings`), the generation settings onto ``eval``, the weights onto the parameter tree
(t5_params.py), its vocabulary (t5_vocab.py) and its export (t5_export.py); `FAMILY` is its
entry in the registry (families.py).

T5 is this project's Transformer with the options docs/model_variants.md's T5 section names:
RMSNorm before each sub-layer and closing each stack (``layer_norm_epsilon``, 1e-6); relative
position buckets, one table per stack (``model.positions`` 't5_relative'); no sqrt(D)
embedding scale; unscaled attention logits (``attention_scale`` 1.0); no biases; ``d_kv`` as
``head_dim``; the feed-forward of ``feed_forward_proj`` (v1.1's 'gated-gelu' is the tanh GELU
gate, 'geglu_tanh'); one input table, the head tied to it and its input rescaled by
d_model^-0.5 (``tie_word_embeddings`` true, v1.0) or a head of its own (false: v1.1,
MADLAD-400; 'inputs': its ``lm_head.weight``, or the shared table where the files hold none,
as transformers 5 ties it; transformers 5 writes ``scale_decoder_outputs`` false for it).
Ids are T5's as they are: pad 0 (the decoder's start), eos 1, unk 2.

Refused in one line, before anything is written: a directory stored in float16 (T5's
activations overflow float16; bfloat16 and float32 work), a feed-forward this model has no
variant for, special ids that are not T5's, a ``vocab_size`` that is not the tokenizer's pieces
plus at most its sentinels and the padding to a multiple of 128.
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformer.data import DataError
from transformer.interop import generation as generation_lib
from transformer.interop import t5_export
from transformer.interop.family import Family, Pretrained
from transformer.interop.generation import (
    CONFIG_FILE,
    GENERATION_FILE,
    generation_settings,
    single_token_bans,
)
from transformer.interop.json_files import read_object
from transformer.interop.state_dict import open_state_dict
from transformer.interop.t5_params import T5Error, params_from_state_dict
from transformer.interop.t5_vocab import (
    T5Vocabulary,
    load_vocabulary,
    tokenizer_files,
    write_vocabulary,
)

MODEL_TYPE = 't5'
# feed_forward_proj -> model.ffn, as transformers' T5Config reads it ('gated-gelu' is
# gelu_new, the tanh approximation).
FEED_FORWARDS = {'relu': 'relu', 'gelu': 'gelu', 'gated-gelu': 'geglu_tanh', 'gated-silu': 'swiglu'}
# transformers' T5Config defaults, for keys a config.json leaves out.
DEFAULTS = {
    'vocab_size': 32128,
    'd_model': 512,
    'd_kv': 64,
    'd_ff': 2048,
    'num_layers': 6,
    'num_heads': 8,
    'relative_attention_num_buckets': 32,
    'relative_attention_max_distance': 128,
    'dropout_rate': 0.1,
    'layer_norm_epsilon': 1e-6,
    'feed_forward_proj': 'relu',
    'tie_word_embeddings': True,
}
IDS = {'pad_token_id': 0, 'eos_token_id': 1, 'decoder_start_token_id': 0}
ROW_MULTIPLE = 128  # T5 v1.1 pads its 32100 ids to 32128 rows


def recognises(directory: str) -> bool:
    """Whether ``directory`` holds a config.json of model_type 't5' and no run directory's
    checkpoints; never raises."""
    config = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(config) or os.path.isdir(os.path.join(directory, 'checkpoints')):
        return False
    try:
        with open(config, encoding='utf-8') as f:
            return json.load(f).get('model_type') == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def _read(path: str) -> dict[str, Any]:
    try:
        return read_object(path)
    except DataError as e:
        raise T5Error(str(e)) from None


def rescaled(hf: dict[str, Any]) -> bool:
    """Whether the head is the shared table with its input rescaled by d_model^-0.5 (T5
    v1.0): transformers 5's ``scale_decoder_outputs`` where config.json has it, else
    ``tie_word_embeddings`` (the hub's T5 v1.1 and MADLAD-400 say false: a head of its
    own)."""
    if 'scale_decoder_outputs' in hf:
        return hf['scale_decoder_outputs'] is not False
    return hf.get('tie_word_embeddings', True) is not False


def model_settings(hf: dict[str, Any], file: str) -> dict[str, Any]:
    """The ``model`` section of a T5 config.json (``file`` names it in errors).

    Raises:
      T5Error: a value this model cannot express, naming the key.
    """
    hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    for key in ('dtype', 'torch_dtype'):
        if hf.get(key) == 'float16':
            raise T5Error(
                f'{file}: {key}=float16: T5 overflows in float16; save the model in float32 '
                'or bfloat16 (model.float().save_pretrained) and convert that.'
            )
    proj = hf['feed_forward_proj']
    if proj not in FEED_FORWARDS:
        raise T5Error(
            f'{file}: feed_forward_proj={proj!r} is not one of {", ".join(FEED_FORWARDS)}.'
        )
    for key, want in IDS.items():
        if hf.get(key, want) != want:
            raise T5Error(f"{file}: {key}={hf[key]!r} is not T5's {want}.")
    tied = rescaled(hf)
    dropout = float(hf['dropout_rate'])
    return {
        'd_model': hf['d_model'],
        'num_heads': hf['num_heads'],
        'head_dim': hf['d_kv'],
        'd_ff': hf['d_ff'],
        'num_encoder_layers': hf['num_layers'],
        'num_decoder_layers': hf.get('num_decoder_layers') or hf['num_layers'],
        'ffn': FEED_FORWARDS[proj],
        'positions': 't5_relative',
        'relative_attention_num_buckets': hf['relative_attention_num_buckets'],
        'relative_attention_max_distance': hf['relative_attention_max_distance'],
        'norm': 'rms_norm',
        'pre_layer_norm': True,
        'layer_norm_epsilon': float(hf['layer_norm_epsilon']),
        'scale_embedding': False,
        'attention_scale': 1.0,
        'attention_bias': False,
        'logits_bias': False,
        'share_embeddings': 'all' if tied else 'inputs',
        'rescale_tied_head': tied,
        'dropout_rate': dropout,
        'attention_dropout_rate': dropout,
        'relu_dropout_rate': dropout,
    }


def _vocabulary(directory: str, hf: dict[str, Any], generation: dict | None) -> T5Vocabulary:
    """The directory's vocabulary with config.json's rows, checked against them, with the ids
    ``bad_words_ids`` bans never emitted (from the file ``generate`` reads it from)."""
    file = os.path.join(directory, CONFIG_FILE)
    rows = hf.get('vocab_size', DEFAULTS['vocab_size'])
    try:
        vocab = T5Vocabulary(directory, rows=rows)
    except DataError as e:
        raise T5Error(str(e)) from None
    most = -(-(vocab.size + vocab.extra_ids) // ROW_MULTIPLE) * ROW_MULTIPLE
    if rows > most:
        raise T5Error(
            f"{file}: vocab_size={rows} is more than the tokenizer's {vocab.size} pieces, "
            f'{vocab.extra_ids} sentinels and their padding to {most}: the tokenizer files are '
            "not the model's."
        )
    keys, name = (hf, CONFIG_FILE) if generation is None else (generation, GENERATION_FILE)
    banned = single_token_bans(keys, rows, 1, os.path.join(directory, name), T5Error)
    return T5Vocabulary(directory, never_emit=banned, rows=rows) if banned else vocab


def load(directory: str, weights: bool = True) -> Pretrained:
    """Reads a T5 directory: its config (checked first), vocabulary and (``weights``)
    parameters; every problem is one `T5Error`, before anything is written."""
    directory = os.fspath(directory)
    file = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(file):
        raise T5Error(f'{file} not found: --from_hf names a T5 directory as the hub serves it.')
    hf = _read(file)
    model = model_settings(hf, file)
    generation_path = os.path.join(directory, GENERATION_FILE)
    generation_file = _read(generation_path) if os.path.isfile(generation_path) else None
    generation = generation_settings(generation_file, hf)
    settings = generation_lib.eval_settings(generation, directory, T5Error)
    tokenizer = _vocabulary(directory, hf, generation_file)
    params = None
    if weights:
        state = open_state_dict(directory, 'T5', T5Error)
        sized = {**model, 'vocab_size': tokenizer.vocab_size}
        params = params_from_state_dict(state, sized, directory)
    files = {CONFIG_FILE: hf, GENERATION_FILE: generation_file}
    return Pretrained(
        't5', directory, model, settings, generation, (None, None), tokenizer, params, files
    )


FAMILY = Family(
    name='t5',
    title='T5',
    model_types=(MODEL_TYPE,),
    recognises=recognises,
    load=load,
    owns_vocabulary=lambda vocabulary: isinstance(vocabulary, T5Vocabulary),
    holds_vocabulary=T5Vocabulary.holds,
    load_vocabulary=load_vocabulary,
    write_vocabulary=write_vocabulary,
    tokenizer_files=tokenizer_files,
    writes=t5_export.WRITES,
    write=t5_export.write_hf,
)
