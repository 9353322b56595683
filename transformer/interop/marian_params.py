"""A MarianMT's tensors (model.safetensors or pytorch_model.bin) read into this project's
parameter tree; marian_export.py's `marian_state_dict` is the inverse.

Two layouts differ, each a permutation (marian.py says why they give the
same function): the sinusoid channels (`marian_channel_order`) on every weight's D axis, and
the vocabulary's rows (the embeddings, ``final_logits_bias``), moved by the vocabulary's
permutation of the ids (`MarianVocabulary.rows_to_ours`, marian_vocab.py): one shared table, or
with separate vocabularies the encoder's and the decoder's (the output tied to it), each by its
side's permutation and padded to the model's one vocabulary size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import state_dict
from transformer.interop.family import PretrainedError

# The output bias of a target id past the target's pieces (separate vocabularies, target the
# smaller side): its logit is this (its embedding row is 0), so its probability underflows to
# exactly 0 in float32 and softmax is over the target's pieces, as Marian's is; finite, and
# within float16's range, so that no dtype turns it into inf or nan.
UNUSED_LOGIT = -1e4


class MarianError(PretrainedError):
    """A MarianMT directory this project cannot read as asked; one line naming the file or key."""


def marian_channel_order(d_model: int) -> np.ndarray:
    """Our channel read by each Marian channel: [0, 2, 4, ..., 1, 3, 5, ...].

    Marian channel i < D/2 is sin(pos / 10000^(2i/D)), ours 2i; channel D/2 + i is the cosine
    of the same frequency, ours 2i + 1.
    """
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
    """The MarianMT's tensors as float32 numpy arrays (transformer/interop/state_dict.py:
    model.safetensors or pytorch_model.bin, whole or sharded), without the ``model.``
    prefix."""
    tensors = state_dict.read_state_dict(directory, 'MarianMT', MarianError)
    return {k.removeprefix('model.'): v for k, v in tensors.items()}


class _Tensors:
    """MarianMT's tensors read into our layout (torch Linear weights are [out, in]); the
    inverse of marian_export.py's `marian_state_dict`."""

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
    state: dict[str, np.ndarray], model: dict[str, Any], tokenizer: Any, where: str
) -> dict[str, Any]:
    """Our parameter tree (nested dicts of float32 arrays) from MarianMT's tensors (`_Tensors`);
    ``where`` names the file in errors. The vocabulary rows of the embeddings and the output
    bias move to our ids (``tokenizer``'s `MarianVocabulary.rows_to_ours`): one shared table,
    or (``model['share_embeddings']`` 'target', separate vocabularies) the encoder's and the
    decoder's, each by its side's ids, the output tied to the decoder's."""
    tensors = _Tensors(state, model, where)
    sizes, d_model = tokenizer.sizes, model['d_model']
    target = sizes['target']
    bias = state.get('final_logits_bias', np.zeros((1, target), np.float32))
    if bias.shape != (1, target):
        raise MarianError(f'{where}: final_logits_bias has shape {bias.shape}, not {(1, target)}.')
    params: dict[str, Any] = {
        # Target ids past the target's pieces: probability 0 (exp underflows to 0 in float32).
        'logits_bias': tokenizer.rows_to_ours(bias[0], 'target', fill=UNUSED_LOGIT),
    }
    if model['share_embeddings'] == 'all':
        shared = tensors.residual(tensors.take('shared.weight', (target, d_model)), 1)
        params['shared_embedding'] = {'embedding': tokenizer.rows_to_ours(shared)}
    else:
        for side, stack in (('source', 'encoder'), ('target', 'decoder')):
            table = tensors.take(f'{stack}.embed_tokens.weight', (sizes[side], d_model))
            rows = tokenizer.rows_to_ours(tensors.residual(table, 1), side)
            params[f'{side}_embedding'] = {'embedding': rows}
    for stack in ('encoder', 'decoder'):
        for i in range(model[f'num_{stack}_layers']):
            params[f'{stack}_layer_{i}'] = tensors.layer(stack, i)
    return params
