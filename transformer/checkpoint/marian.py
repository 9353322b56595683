"""Hugging Face MarianMT (OPUS-MT) directories read as this project's models: the config
mapped onto the ``model`` and ``eval`` sections, the weights onto the parameter tree.

A MarianMT is the paper's post-LN Transformer with a few options this project declares as
model variants and settings (transformer/model/variants.py, settings.py): the feed-forward's
activation (``model.ffn``: 'swish', 'gelu', 'relu'), biases on the attention projections
(``model.attention_bias``), the output bias ``final_logits_bias`` (``model.logits_bias``)
and layer norm epsilon 1e-5. Two layouts differ and are mapped exactly, each a permutation:

* Sinusoid channels: Marian puts all sines first, then all cosines; ours interleave them
  (`marian_channel_order`). Every weight that touches the residual stream is permuted on its
  D axis, which gives the same function (layer norm and the tied logits are invariant to it).
* Vocabulary rows: Marian's eos is 0, unk 1 and pad V - 1 (also the decoder start); ours
  pad 0 (the decoder start), eos 1, unk 2 (transformer/tokens.py). Our id of Marian id m is
  (m + 1) mod V (`transformer.data.MarianVocabulary`), so the embedding rows and the output
  bias are rotated by one.

Values Hugging Face's Marian acts on that this model cannot express (a separate decoder
vocabulary, different encoder and decoder head counts or widths, another ``model_type``,
other special ids) stop in one `MarianError` naming the key, before anything is written;
keys Hugging Face's Marian ignores (``normalize_before``, ``static_position_embeddings``,
...) are ignored here too.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from transformer import data as data_lib
from transformer.rundir import WorkdirError

CONFIG_FILE = 'config.json'
GENERATION_FILE = 'generation_config.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
# The weights, in the order they are looked for.
WEIGHT_FILES = ('model.safetensors', 'pytorch_model.bin')
# Hugging Face's activation names -> model.ffn (ACT2FN: 'silu' and 'swish' are one function).
ACTIVATIONS = {'swish': 'swish', 'silu': 'swish', 'gelu': 'gelu', 'relu': 'relu'}
# Marian's layer norms are torch's default nn.LayerNorm.
LAYER_NORM_EPSILON = 1e-5
# What Hugging Face's generate applies to a setting a model's files leave unset (transformers'
# GenerationConfig defaults): greedy search, length_penalty 1.0 (its rule divides a beam's
# log-probability by length^1.0), at most 20 tokens.
HF_DEFAULTS = {'num_beams': 1, 'length_penalty': 1.0, 'max_length': 20}
HF_DEFAULT = "Hugging Face's default"


class MarianError(WorkdirError):
    """A MarianMT directory this project cannot read as asked; one line naming the file or key."""


def marian_channel_order(d_model: int) -> np.ndarray:
    """Our channel read by each Marian channel: [0, 2, 4, ..., 1, 3, 5, ...].

    Marian channel i < D/2 is sin(pos / 10000^(2i/D)), ours 2i; channel D/2 + i is the cosine
    of the same frequency, ours 2i + 1.
    """
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def is_marian_dir(path: str) -> bool:
    """Whether ``path`` looks like a MarianMT directory (a config.json of model_type 'marian'
    and no run directory's checkpoints)."""
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config) or os.path.isdir(os.path.join(path, 'checkpoints')):
        return False
    try:
        with open(config, encoding='utf-8') as f:
            return json.load(f).get('model_type') == 'marian'
    except (OSError, ValueError, AttributeError):
        return False


def _read_json(directory: str, name: str, required: bool = True) -> dict[str, Any]:
    file = os.path.join(directory, name)
    if not os.path.isfile(file):
        if required:
            raise MarianError(
                f'{file} not found: --from_hf names a MarianMT directory as the '
                'hub serves it (config.json, model.safetensors, source.spm, '
                'target.spm, vocab.json).'
            )
        return {}
    try:
        with open(file, encoding='utf-8') as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise MarianError(f'{file} is not valid JSON ({e}).') from None
    if not isinstance(value, dict):
        raise MarianError(f'{file} holds {type(value).__name__}, not a JSON object.')
    return value


def check_expressible(hf: dict[str, Any], file: str) -> None:
    """A `MarianError` naming the first key of a MarianMT config.json (``file``) whose value
    this model cannot express."""

    def refuse(key: str, why: str) -> MarianError:
        return MarianError(f'{file}: {key}={hf.get(key)!r} {why}')

    if hf.get('model_type') != 'marian':
        raise refuse('model_type', "is not a MarianMT ('marian'); only MarianMT converts.")
    vocab = hf.get('vocab_size')
    if hf.get('decoder_vocab_size') not in (None, vocab):
        raise refuse(
            'decoder_vocab_size',
            f'differs from vocab_size={vocab}: a separate '
            'decoder vocabulary is not expressible (one joint vocabulary here).',
        )
    for key in ('share_encoder_decoder_embeddings', 'tie_word_embeddings', 'scale_embedding'):
        if hf.get(key, True) is not True:
            raise refuse(
                key,
                'is not expressible: the source and target embeddings and the '
                'output projection are one matrix, scaled by sqrt(d_model) (Sec. 3.4).',
            )
    for ours, encoder, decoder in (
        ('num_heads', 'encoder_attention_heads', 'decoder_attention_heads'),
        ('d_ff', 'encoder_ffn_dim', 'decoder_ffn_dim'),
    ):
        if hf.get(encoder) != hf.get(decoder):
            raise refuse(
                decoder,
                f'differs from {encoder}={hf.get(encoder)!r}: one model.{ours} serves both stacks.',
            )
    activation = hf.get('activation_function', 'gelu')
    if activation not in ACTIVATIONS:
        raise refuse('activation_function', f'is not one of {", ".join(ACTIVATIONS)}.')
    special = {'eos_token_id': 0, 'pad_token_id': vocab - 1, 'decoder_start_token_id': vocab - 1}
    for key, wanted in special.items():
        if hf.get(key, wanted) != wanted:
            raise refuse(
                key,
                f'is not {wanted}: Marian ids (eos 0, unk 1, pad and decoder '
                'start V - 1) are the ones mapped onto ours.',
            )


def model_settings(hf: dict[str, Any], file: str) -> dict[str, Any]:
    """The ``model`` section of a MarianMT config.json (``file`` names it in errors).

    Raises:
      MarianError: a value this model cannot express, naming the key (`check_expressible`).
    """
    check_expressible(hf, file)
    return {
        'd_model': hf['d_model'],
        'num_heads': hf['encoder_attention_heads'],
        'd_ff': hf['encoder_ffn_dim'],
        'num_encoder_layers': hf['encoder_layers'],
        'num_decoder_layers': hf['decoder_layers'],
        'ffn': ACTIVATIONS[hf.get('activation_function', 'gelu')],
        'attention_bias': True,
        'logits_bias': True,
        'layer_norm_epsilon': LAYER_NORM_EPSILON,
        'dropout_rate': float(hf.get('dropout', 0.1)),
        'attention_dropout_rate': float(hf.get('attention_dropout', 0.0)),
        'relu_dropout_rate': float(hf.get('activation_dropout', 0.0)),
        'share_embeddings': 'all',
        'pre_layer_norm': False,
    }


def generation_settings(
    generation: dict[str, Any] | None, hf: dict[str, Any]
) -> dict[str, tuple[Any, str]]:
    """{key: (value, where it came from)} of `HF_DEFAULTS`' keys as Hugging Face's ``generate``
    applies them to a MarianMT directory: from its generation_config.json (``generation``)
    when there is one, and then none from config.json (transformers 5 loads only that file),
    else from config.json (``hf``: older OPUS-MT directories keep num_beams and max_length
    there), and a key the file leaves unset takes transformers' default."""
    keys, file = (generation, GENERATION_FILE) if generation is not None else (hf, CONFIG_FILE)
    return {
        key: (keys[key], file) if keys.get(key) is not None else (default, HF_DEFAULT)
        for key, default in HF_DEFAULTS.items()
    }


def eval_settings(generation: dict[str, tuple[Any, str]], directory: str) -> dict[str, Any]:
    """The ``eval`` settings of `generation_settings` (read from ``directory``): the beam
    size, and the length penalty with Hugging Face's rule (a beam's log-probability divided
    by length^x: 'fairseq'). The absolute max_length is not copied: this project decodes up
    to the input's length plus eval.extra_length."""
    (beams, beams_from), (penalty, penalty_from) = (
        generation['num_beams'],
        generation['length_penalty'],
    )
    if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
        raise MarianError(
            f'{os.path.join(directory, beams_from)}: num_beams={beams!r} is not a positive '
            'whole number.'
        )
    if isinstance(penalty, bool) or not isinstance(penalty, int | float) or penalty < 0:
        raise MarianError(
            f'{os.path.join(directory, penalty_from)}: length_penalty={penalty!r} is not '
            'expressible: eval.alpha is a number >= 0 (a negative one, which favours short '
            'outputs, has no setting here).'
        )
    return {'beam_size': beams, 'alpha': float(penalty), 'length_penalty': 'fairseq'}


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
    """The MarianMT's tensors as float32 numpy arrays, from model.safetensors or
    pytorch_model.bin (whichever is there first), without the ``model.`` prefix."""
    for name in WEIGHT_FILES:
        file = os.path.join(directory, name)
        if os.path.isfile(file):
            break
    else:
        raise MarianError(
            f'{directory} holds neither {" nor ".join(WEIGHT_FILES)}: the '
            'MarianMT weights are missing.'
        )
    try:
        if name.endswith('.safetensors'):
            from safetensors.numpy import load_file

            tensors = load_file(file)
        else:
            import torch

            tensors = {
                k: v.float().numpy()
                for k, v in torch.load(file, map_location='cpu', weights_only=True).items()
            }
    except ImportError as e:
        raise MarianError(
            f'Reading {file} needs the export extra ({e.name} is not installed): '
            "pip install 'transformer[export]'."
        ) from None
    except Exception as e:  # noqa: BLE001 - safetensors and torch raise their own types
        raise MarianError(f'{file} cannot be read ({str(e).splitlines()[0][:200]}).') from None
    return {k.removeprefix('model.'): np.asarray(v, np.float32) for k, v in tensors.items()}


class _Tensors:
    """MarianMT's tensors read into our layout (torch Linear weights are [out, in]); the
    inverse of transformer/commands/marian.py's `marian_state_dict`."""

    def __init__(self, state: dict[str, np.ndarray], model: dict[str, Any], where: str):
        self.state, self.where = state, where
        self.d_model, self.d_ff = model['d_model'], model['d_ff']
        self.heads = model['num_heads']
        self.head_dim = self.d_model // self.heads
        self.perm = marian_channel_order(self.d_model)

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.state:
            raise MarianError(f'{self.where} has no tensor {name}.')
        value = self.state[name]
        if value.shape != shape:
            raise MarianError(
                f'{self.where}: {name} has shape {value.shape}, not {shape} as config.json says.'
            )
        return value

    def residual(self, x: np.ndarray, axis: int) -> np.ndarray:
        """x with its D axis (Marian's channel order) in ours."""
        out = np.empty_like(x)
        index = [slice(None)] * x.ndim
        index[axis] = self.perm
        out[tuple(index)] = x
        return out

    def attention(self, prefix: str) -> dict[str, Any]:
        d, n, h = self.d_model, self.heads, self.head_dim
        found = {}
        for ours, theirs in (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj')):
            w = self.take(f'{prefix}.{theirs}.weight', (n * h, d))
            found[ours] = {
                'kernel': self.residual(w.T.reshape(d, n, h), 0),  # [D, N, H]
                'bias': self.take(f'{prefix}.{theirs}.bias', (n * h,)).reshape(n, h),
            }
        w = self.take(f'{prefix}.out_proj.weight', (d, n * h))
        found['out'] = {
            'kernel': self.residual(w.T.reshape(n, h, d), 2),  # [N, H, D]
            'bias': self.residual(self.take(f'{prefix}.out_proj.bias', (d,)), 0),
        }
        return found

    def norm(self, name: str) -> dict[str, Any]:
        return {
            'scale': self.residual(self.take(f'{name}.weight', (self.d_model,)), 0),
            'bias': self.residual(self.take(f'{name}.bias', (self.d_model,)), 0),
        }

    def ffn(self, prefix: str) -> dict[str, Any]:
        d, f = self.d_model, self.d_ff
        return {
            'wi': {
                'kernel': self.residual(self.take(f'{prefix}.fc1.weight', (f, d)).T, 0),
                'bias': self.take(f'{prefix}.fc1.bias', (f,)),
            },
            'wo': {
                'kernel': self.residual(self.take(f'{prefix}.fc2.weight', (d, f)).T, 1),
                'bias': self.residual(self.take(f'{prefix}.fc2.bias', (d,)), 0),
            },
        }

    def layer(self, stack: str, i: int) -> dict[str, Any]:
        prefix = f'{stack}.layers.{i}'
        layer = {
            'self_attention': self.attention(f'{prefix}.self_attn'),
            'self_attention_norm': self.norm(f'{prefix}.self_attn_layer_norm'),
            'ffn': self.ffn(prefix),
            'ffn_norm': self.norm(f'{prefix}.final_layer_norm'),
        }
        if stack == 'decoder':
            layer['cross_attention'] = self.attention(f'{prefix}.encoder_attn')
            layer['cross_attention_norm'] = self.norm(f'{prefix}.encoder_attn_layer_norm')
        return layer


def params_from_state_dict(
    state: dict[str, np.ndarray], model: dict[str, Any], vocab_size: int, where: str
) -> dict[str, Any]:
    """Our parameter tree (nested dicts of float32 arrays) from MarianMT's tensors (`_Tensors`);
    ``where`` names the file in errors. The vocabulary rows of the embedding and the output
    bias move to our ids (`transformer.data.MarianVocabulary.rows_to_ours`)."""
    tensors = _Tensors(state, model, where)
    embedding = tensors.residual(tensors.take('shared.weight', (vocab_size, model['d_model'])), 1)
    bias = state.get('final_logits_bias', np.zeros((1, vocab_size), np.float32))
    if bias.shape != (1, vocab_size):
        raise MarianError(
            f'{where}: final_logits_bias has shape {bias.shape}, not {(1, vocab_size)}.'
        )
    params: dict[str, Any] = {
        'shared_embedding': {'embedding': data_lib.MarianVocabulary.rows_to_ours(embedding)},
        'logits_bias': data_lib.MarianVocabulary.rows_to_ours(bias[0]),
    }
    for stack in ('encoder', 'decoder'):
        for i in range(model[f'num_{stack}_layers']):
            params[f'{stack}_layer_{i}'] = tensors.layer(stack, i)
    return params


@dataclasses.dataclass
class MarianModel:
    """A MarianMT directory read into this project's terms."""

    directory: str
    model: dict[str, Any]  # the config's model section
    eval: dict[str, Any]  # the eval settings generate applies to it (`eval_settings`)
    generation: dict[str, tuple[Any, str]]  # `generation_settings`: value, where it came from
    languages: tuple[str | None, str | None]  # tokenizer_config.json's source and target
    tokenizer: Any  # transformer.data.MarianVocabulary
    params: dict[str, Any] | None  # None until `load_marian(..., weights=True)`


def load_marian(directory: str, *, weights: bool = True) -> MarianModel:
    """Reads a MarianMT directory: its config (checked first), vocabulary and (``weights``)
    parameters. Nothing is downloaded; every problem is one `MarianError`."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise MarianError(
            f'{directory} is not a directory: --from_hf names a local MarianMT '
            "directory (download one with the hub's own tool first)."
        )
    file = os.path.join(directory, CONFIG_FILE)
    hf = _read_json(directory, CONFIG_FILE)
    model = model_settings(hf, file)
    if model['d_model'] % model['num_heads'] or model['d_model'] % 2:
        raise MarianError(
            f'{file}: d_model={model["d_model"]} must be even and a multiple of '
            f'encoder_attention_heads={model["num_heads"]}.'
        )
    has_generation = os.path.isfile(os.path.join(directory, GENERATION_FILE))
    generation = generation_settings(
        _read_json(directory, GENERATION_FILE) if has_generation else None, hf
    )
    settings = eval_settings(generation, directory)
    tokenizer_config = _read_json(directory, TOKENIZER_CONFIG, required=False)
    if tokenizer_config.get('separate_vocabs'):
        raise MarianError(
            f'{os.path.join(directory, TOKENIZER_CONFIG)}: separate_vocabs=True '
            'is not expressible (one joint vocabulary here).'
        )
    try:
        tokenizer = data_lib.MarianVocabulary(directory)
    except data_lib.DataError as e:
        raise MarianError(str(e)) from None
    if tokenizer.vocab_size != hf['vocab_size']:
        raise MarianError(
            f'{file}: vocab_size={hf["vocab_size"]} but vocab.json holds '
            f'{tokenizer.vocab_size} pieces.'
        )
    params = None
    if weights:
        state = read_state_dict(directory)
        params = params_from_state_dict(state, model, tokenizer.vocab_size, directory)
    languages = (tokenizer_config.get('source_lang'), tokenizer_config.get('target_lang'))
    return MarianModel(directory, model, settings, generation, languages, tokenizer, params)
