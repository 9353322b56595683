"""The MarianMT family's export (``export --format hf``): the parameter mapping, the configs,
the tokenizer files. (The CTranslate2 export writes its model directly:
transformer/commands/ctranslate2_spec.py.)

MarianMT is the same architecture as the paper's post-LN Transformer (sinusoidal positions,
embeddings scaled by sqrt(d_model), a ReLU, swish or GELU FFN, one matrix for both embeddings
and the pre-softmax projection), so the export is a reparametrisation, not an approximation. Two
layouts differ and are mapped here (`marian_state_dict`):

* Sinusoids. ``model.sinusoidal_positions`` interleaves them (channel 2i sin, 2i+1 cos, as the
  paper writes PE); Marian puts all sines first, then all cosines. Permuting the d_model axis
  of every weight that touches the residual stream (embeddings, each kernel's D axis, layer
  norm scales and biases) by the same permutation gives the same function: layer norm and the
  tied logits are invariant to it, every other operation is a sum over D.
* Biases. Marian has biases on the attention projections: ours with
  ``model.attention_bias``, zeros without. Its ``final_logits_bias`` is ``model.logits_bias``'s
  parameter, or zeros.

What the files hold of a model is declared once, `WRITES` (transformer/formats.py): the
values of each variant field and numeric setting that the mapping below writes; any other is
refused in one line before anything is written.

Layer norm epsilon is hard-coded to 1e-5 in Hugging Face Marian; ``model.layer_norm_epsilon``
(1e-6 by default) is kept in the CTranslate2 export's config, and its effect on the Hugging Face
logits is measured in docs/export.md ("Exact, and where it still differs").
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np

from transformer.data import Tokenizer
from transformer.formats import (
    ExportError,
    Format,
    Writes,
    heads_of_d_model,
    max_length,
    one_kv_head_per_query,
)
from transformer.interop.marian_params import marian_channel_order
from transformer.interop.marian_vocab import MarianVocabulary
from transformer.model import TransformerConfig, export_refusal
from transformer.tokens import JOINT

SPM_FILES = ('source.spm', 'target.spm')
# The config.json values an export derives from the model, its vocabulary and its weights
# (`marian_configs`); a converted run's export writes its source's other values back.
DERIVED_KEYS = (
    *('vocab_size', 'decoder_vocab_size', 'd_model', 'encoder_layers', 'decoder_layers'),
    *('encoder_attention_heads', 'decoder_attention_heads', 'encoder_ffn_dim'),
    *('decoder_ffn_dim', 'pad_token_id', 'eos_token_id', 'decoder_start_token_id', 'dtype'),
    'share_encoder_decoder_embeddings',
)


# What the MarianMT files hold of a model (transformer/formats.py): the values of each variant
# field (transformer/model/variants.py) and numeric setting (transformer/model/settings.py)
# that `marian_state_dict` and `marian_configs` map. Any other value is refused.
WRITES = Format(
    'hf',
    'MarianMT',
    {
        'ffn': Writes(
            ('relu', 'swish', 'gelu'),
            "MarianMT's feed-forward has no gate, and its activation is named by transformers",
        ),
        'norm': Writes(('layer_norm',), "MarianMT's norms are LayerNorms"),
        'pre_layer_norm': Writes(
            (False,), 'MarianMT is post-LN only (no final layer norm, no pre-LN option)'
        ),
        # 'target': the encoder's and the decoder's tables, lm_head tied to the decoder's
        # (share_encoder_decoder_embeddings=false, as separate_vocabs models have).
        'share_embeddings': Writes(
            ('all', 'target'), "MarianMT's lm_head is the decoder's embedding (tied)"
        ),
        'logits_bias': Writes((False, True)),  # final_logits_bias, zeros without
        'positions': Writes(('sinusoidal',), 'MarianMT adds sinusoids to the embeddings'),
        'head_dim': heads_of_d_model('MarianMT'),
        'num_kv_heads': one_kv_head_per_query('MarianMT'),
        'attention_bias': Writes((False, True)),  # zeros without
        'qk_norm': Writes((False,), 'MarianMT has no norm on queries and keys'),
    },
)


def special_ids(tokenizer: Any) -> dict[str, Any]:
    """The export's pad, eos, decoder start and never-emitted ids: the vocabulary's
    (``tokenizer.special``), or, for a run that reads a MarianMT vocabulary, Marian's as its
    target's vocabulary has them (the export moves its rows back; the ids past a smaller
    target's pieces are not written: the exported model has none)."""
    special = tokenizer.special
    marian = isinstance(tokenizer, MarianVocabulary)
    native = tokenizer.marian_id if marian else int
    target = tokenizer.sizes['target'] if marian else tokenizer.vocab_size
    return {
        'pad': native(special.pad),
        'eos': native(special.eos),
        'start': native(special.decoder_start),
        'never': [native(i) for i in special.never_emit if i < target],
    }


def vocab_sizes(tokenizer: Any, cfg: TransformerConfig) -> dict[str, int]:
    """The number of rows of each side's table in the export: a MarianMT vocabulary's sizes
    (separate vocabularies: each its own), else the model's V for both."""
    if isinstance(tokenizer, MarianVocabulary):
        return dict(tokenizer.sizes)
    return {'source': cfg.vocab_size, 'target': cfg.vocab_size}


def marian_state_dict(
    params: Any, cfg: TransformerConfig, tokenizer: Any = None
) -> dict[str, np.ndarray]:
    """Our parameter tree -> MarianMTModel's state dict (torch Linear weights are [out, in]).
    ``tokenizer``: a MarianMT vocabulary puts the vocabulary rows back in its own id order
    (`MarianVocabulary.rows_to_marian`; separate vocabularies: each side's, the padded rows
    dropped); any other keeps ours."""
    perm = marian_channel_order(cfg.d_model)
    marian_rows = isinstance(tokenizer, MarianVocabulary)
    rows = tokenizer.rows_to_marian if marian_rows else np.asarray
    f32 = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))  # noqa: E731
    state = {}

    def attention(prefix: str, p: dict[str, Any]) -> None:
        for ours, theirs in (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj')):
            kernel = np.asarray(p[ours]['kernel'])[perm]  # [D, N, H], D in Marian's order
            state[f'{prefix}.{theirs}.weight'] = f32(kernel.reshape(cfg.d_model, -1).T)
            bias = p[ours].get('bias', np.zeros(kernel.shape[1:], np.float32))
            state[f'{prefix}.{theirs}.bias'] = f32(np.reshape(bias, -1))
        out = np.asarray(p['out']['kernel'])[..., perm]  # [N, H, D]
        state[f'{prefix}.out_proj.weight'] = f32(out.reshape(-1, cfg.d_model).T)
        bias = np.asarray(p['out'].get('bias', np.zeros(cfg.d_model, np.float32)))
        state[f'{prefix}.out_proj.bias'] = f32(bias[perm])

    def norm(name: str, p: dict[str, Any]) -> None:
        state[f'{name}.weight'] = f32(np.asarray(p['scale'])[perm])
        state[f'{name}.bias'] = f32(np.asarray(p['bias'])[perm])

    def ffn(prefix: str, p: dict[str, Any]) -> None:
        state[f'{prefix}.fc1.weight'] = f32(np.asarray(p['wi']['kernel'])[perm].T)  # [F, D]
        state[f'{prefix}.fc1.bias'] = f32(p['wi']['bias'])
        state[f'{prefix}.fc2.weight'] = f32(np.asarray(p['wo']['kernel'])[:, perm].T)  # [D, F]
        state[f'{prefix}.fc2.bias'] = f32(np.asarray(p['wo']['bias'])[perm])

    sizes = vocab_sizes(tokenizer, cfg)
    if cfg.share_embeddings == 'all':
        # One matrix: transformers ties the encoder's, the decoder's and lm_head's to it.
        state['model.shared.weight'] = f32(rows(params['shared_embedding']['embedding'])[:, perm])
    else:  # 'target': each side's table; transformers ties lm_head to the decoder's
        for side, stack in (('source', 'encoder'), ('target', 'decoder')):
            table = params[f'{side}_embedding']['embedding']
            table = rows(table, side) if marian_rows else np.asarray(table)
            state[f'model.{stack}.embed_tokens.weight'] = f32(table[: sizes[side], perm])
    # model.logits_bias's [V], in the target table's row order (the ids are the same); zeros
    # without it, the logits our model computes.
    bias = params.get('logits_bias', np.zeros(cfg.vocab_size, np.float32))
    bias = rows(bias, 'target') if marian_rows else np.asarray(bias)
    state['final_logits_bias'] = f32(np.reshape(bias[: sizes['target']], (1, sizes['target'])))
    for stack, count in (('encoder', cfg.num_encoder_layers), ('decoder', cfg.num_decoder_layers)):
        for i in range(count):
            p, prefix = params[f'{stack}_layer_{i}'], f'model.{stack}.layers.{i}'
            attention(f'{prefix}.self_attn', p['self_attention'])
            norm(f'{prefix}.self_attn_layer_norm', p['self_attention_norm'])
            if stack == 'decoder':
                attention(f'{prefix}.encoder_attn', p['cross_attention'])
                norm(f'{prefix}.encoder_attn_layer_norm', p['cross_attention_norm'])
            ffn(prefix, p['ffn'])
            norm(f'{prefix}.final_layer_norm', p['ffn_norm'])
    return state


def marian_configs(
    cfg: TransformerConfig,
    ev: Any,
    max_len: int,
    length_exponent: float,
    ids: dict[str, int] | None = None,
    sizes: dict[str, int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, generation_config.json) of the export; ``ev`` is the run's eval section,
    ``max_len`` its longest training row (data.max_len), ``length_exponent`` the exponent of
    its length penalty (``decoding.length_power``), ``ids`` its pad, eos, start and
    never-emitted ids (`special_ids`; default the joint vocabulary's), ``sizes`` each side's
    number of rows (`vocab_sizes`; default the model's V)."""
    joint = {'pad': JOINT.pad, 'eos': JOINT.eos, 'start': JOINT.decoder_start}
    joint['never'] = list(JOINT.never_emit)
    pad, eos, start, never = (ids or joint).values()
    longest = max_length(ev, max_len)
    sizes = sizes or {'source': cfg.vocab_size, 'target': cfg.vocab_size}
    config = {
        'architectures': ['MarianMTModel'],
        'model_type': 'marian',
        'vocab_size': sizes['source'],
        'decoder_vocab_size': sizes['target'],
        'd_model': cfg.d_model,
        'encoder_layers': cfg.num_encoder_layers,
        'decoder_layers': cfg.num_decoder_layers,
        'encoder_attention_heads': cfg.num_heads,
        'decoder_attention_heads': cfg.num_heads,
        'encoder_ffn_dim': cfg.d_ff,
        'decoder_ffn_dim': cfg.d_ff,
        # Each exportable model.ffn is named as transformers' ACT2FN and CTranslate2 name it
        # (transformer/model/feed_forward.py ACTIVATIONS): 'relu', 'swish', 'gelu' (erf).
        'activation_function': cfg.ffn,
        # Hugging Face recomputes the sinusoid table instead of storing it; at least 1024 rows,
        # as the CTranslate2 export's stored table (transformer/commands/ctranslate2_spec.py).
        'max_position_embeddings': max(longest, 1024),
        'scale_embedding': True,  # x sqrt(d_model), Sec. 3.4
        'share_encoder_decoder_embeddings': cfg.share_embeddings == 'all',
        'tie_word_embeddings': True,
        'dropout': cfg.dropout_rate,
        'attention_dropout': cfg.attention_dropout_rate,
        'activation_dropout': cfg.relu_dropout_rate,
        'pad_token_id': pad,
        'eos_token_id': eos,
        'decoder_start_token_id': start,
        'dtype': 'float32',
    }
    generation = {
        'decoder_start_token_id': start,
        'pad_token_id': pad,
        'eos_token_id': eos,
        'forced_eos_token_id': eos,  # EOS at the length limit, as our decoder forces it
        'bad_words_ids': [[i] for i in never],  # never generated (decoding/next_token.py)
        'num_beams': int(ev.beam_size),
        # Hugging Face divides by length^x: exact for 'fairseq', said in a warning for 'gnmt'.
        'length_penalty': length_exponent,
        'max_length': longest,
    }
    return config, generation


def write_tokenizer(tokenizer: Tokenizer, directory: str, data: Any) -> None:
    """source.spm = target.spm = our joint SentencePiece model; vocab.json maps pieces to ours.
    A MarianMT vocabulary's run (converted, or fine-tuned from one) writes its own files as
    they are."""
    if isinstance(tokenizer, MarianVocabulary):
        tokenizer.copy_to(directory)
        return
    for name in SPM_FILES:
        shutil.copyfile(tokenizer.model_path, os.path.join(directory, name))
    vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    if len(vocab) != tokenizer.vocab_size:
        raise ExportError(f'{tokenizer.model_path} has duplicate pieces; vocab.json needs unique.')
    _write_json(os.path.join(directory, 'vocab.json'), vocab)
    _write_json(
        os.path.join(directory, 'tokenizer_config.json'),
        {
            'tokenizer_class': 'MarianTokenizer',
            'source_lang': data.source_lang,
            'target_lang': data.target_lang,
            'separate_vocabs': False,
            'model_max_length': int(data.max_len),
            'unk_token': tokenizer.id_to_piece(tokenizer.special.unk),
            'eos_token': tokenizer.id_to_piece(tokenizer.special.eos),
            'pad_token': tokenizer.id_to_piece(tokenizer.special.pad),
        },
    )


def with_source_files(
    model_config: dict[str, Any], generation: dict[str, Any], source: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(config.json, generation_config.json) of a converted run's export: the source
    directory's own (``source``: `Pretrained.files`, as converted_from.json records them),
    so its values come back (max_position_embeddings, max_length, ...), with the values this
    export derives from the model written over them (`DERIVED_KEYS`, equal for a converted
    run) and the dtype of the weights it writes. A source without generation_config.json gets
    none back: Hugging Face reads config.json's settings then, as it read the source's."""
    config = {**model_config, **source['config.json']}
    config.update({k: model_config[k] for k in DERIVED_KEYS})
    config.pop('torch_dtype', None)  # transformers' older name of dtype
    recorded = source.get('generation_config.json')
    return config, None if recorded is None else {**generation, **recorded}


def write_hf(
    directory: str,
    cfg: TransformerConfig,
    run_config: Any,
    tokenizer: Tokenizer,
    params: Any,
    source: dict[str, Any] | None = None,
    *,
    length_exponent: float,
) -> None:
    """Writes the MarianMT directory (weights, configs, tokenizer files) into ``directory``.

    Args:
      directory: an existing, empty directory.
      cfg: the model's configuration (`export.check_expressible` has passed its run).
      run_config: the run's config (its ``eval`` and ``data`` sections are read).
      tokenizer: the run's vocabulary.
      params: the parameters to export.
      source: a converted run's source files (`with_source_files`); None: a run trained here.
      length_exponent: generation_config.json's length_penalty (``decoding.length_power`` of
        the run's eval section).
    """
    refusal = export_refusal(cfg, WRITES)  # what the mapping below has no names for
    if refusal:
        raise ExportError(refusal)
    from safetensors.numpy import save

    ids = special_ids(tokenizer)
    ev, max_len = run_config.eval, run_config.data.max_len
    sizes = vocab_sizes(tokenizer, cfg)
    model_config, generation = marian_configs(cfg, ev, max_len, length_exponent, ids, sizes)
    if source:
        model_config, generation = with_source_files(model_config, generation, source)
    # transformers refuses safetensors files whose metadata does not name a framework.
    weights = save(marian_state_dict(params, cfg, tokenizer), metadata={'format': 'pt'})
    with open(os.path.join(directory, 'model.safetensors'), 'wb') as f:
        f.write(weights)
    _write_json(os.path.join(directory, 'config.json'), model_config)
    if generation is not None:
        _write_json(os.path.join(directory, 'generation_config.json'), generation)
    write_tokenizer(tokenizer, directory, run_config.data)


def _write_json(path: str, value: Any) -> None:
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write('\n')
