"""T5's tensors (``T5ForConditionalGeneration``: T5, T5 v1.1, MADLAD-400) and this project's
parameter tree, both ways: `params_from_state_dict` reads, `state_dict_from_params` writes.

The two are one network (docs/model_variants.md, T5): torch's Linear weights are [out, in],
ours [in, out] with the heads split out ([D, N, H], [N, H, D]); T5's relative position table
([buckets, heads]) sits in its stack's block 0 and every block reads it, ours is one per stack
(``encoder_positions``, ``decoder_positions``); the ids are T5's as they are. The output head is
``lm_head.weight`` where the model has one of its own (``tie_word_embeddings`` false: T5 v1.1,
MADLAD-400); a directory without it uses the shared table, as transformers 5 ties it. T5
v1.0's ReLU feed-forward has no biases; ours ('relu') has, and reads zeros, and a tree whose
biases are not zero does not write back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.interop.family import PretrainedError

GATED = ('wi_0', 'wi_1', 'wo')  # T5 v1.1's gated feed-forward
UNGATED = ('wi', 'wo')  # T5 v1.0's
SUBLAYERS = {
    'encoder': ('self_attention', 'ffn'),
    'decoder': ('self_attention', 'cross_attention', 'ffn'),
}
ATTENTION = {'self_attention': 'SelfAttention', 'cross_attention': 'EncDecAttention'}
TABLE = '{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight'


class T5Error(PretrainedError):
    """A T5 directory this project cannot read as asked; one line naming the file or key."""


class _Reader:
    """The tensors of a state dict, each checked against the shape the config gives."""

    def __init__(self, state: Mapping[str, np.ndarray], model: dict[str, Any], where: str):
        self.state, self.where = state, where
        self.d, self.n, self.h = model['d_model'], model['num_heads'], model['head_dim']

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.state:
            raise T5Error(f"{self.where} has no tensor {name}: the weights are not the config's.")
        value = self.state[name]
        if value.shape != shape:
            raise T5Error(
                f'{self.where}: {name} has shape {value.shape}, not {shape} as config.json says.'
            )
        return value

    def attention(self, prefix: str) -> dict[str, Any]:
        d, n, h = self.d, self.n, self.h
        found = {
            ours: {'kernel': self.take(f'{prefix}.{t}.weight', (n * h, d)).T.reshape(d, n, h)}
            for ours, t in (('query', 'q'), ('key', 'k'), ('value', 'v'))
        }
        found['out'] = {'kernel': self.take(f'{prefix}.o.weight', (d, n * h)).T.reshape(n, h, d)}
        return found

    def ffn(self, prefix: str, d_ff: int, gated: bool) -> dict[str, Any]:
        shapes = {'wi': (d_ff, self.d), 'wi_0': (d_ff, self.d), 'wi_1': (d_ff, self.d)}
        shapes['wo'] = (self.d, d_ff)
        names = GATED if gated else UNGATED
        ffn = {n: {'kernel': _ours(self.take(f'{prefix}.{n}.weight', shapes[n]).T)} for n in names}
        if not gated:  # ours has biases; T5's are zero
            for p in ffn.values():
                p['bias'] = np.zeros(p['kernel'].shape[1], np.float32)
        return ffn


def _ours(value: np.ndarray) -> np.ndarray:
    """A transposed tensor as an array of its own: the tensor read is let go as it is
    converted (the state dict may read each when taken), and the checkpoint's writer gets
    contiguous arrays it does not copy again."""
    return np.ascontiguousarray(value)


def is_gated(model: dict[str, Any]) -> bool:
    return model['ffn'] not in ('relu', 'gelu')


def params_from_state_dict(
    state: Mapping[str, np.ndarray], model: dict[str, Any], where: str
) -> dict[str, Any]:
    """Our parameter tree (nested dicts of float32 arrays, one subtree per layer) of a T5
    state dict; ``model``: the ``model`` section its config.json maps onto (t5.py),
    ``where`` names the directory in errors; each tensor is taken from ``state`` once and
    converted as it is taken (`state_dict.open_state_dict`). Vocabulary rows as they are."""
    read = _Reader(state, model, where)
    rows, d = model['vocab_size'], model['d_model']
    shared = read.take('shared.weight', (rows, d))
    params: dict[str, Any] = {'shared_embedding': {'embedding': shared}}
    if model['share_embeddings'] == 'inputs':
        # Without a head of its own, transformers 5 ties it to the shared table.
        has_head = 'lm_head.weight' in state
        head = read.take('lm_head.weight', (rows, d)) if has_head else shared
        params['logits_dense'] = {'kernel': _ours(head.T)}
    buckets = (model['relative_attention_num_buckets'], model['num_heads'])
    for stack, names in SUBLAYERS.items():
        params[f'{stack}_positions'] = {'bias': read.take(TABLE.format(stack=stack), buckets)}
        params[f'{stack}_norm'] = {'scale': read.take(f'{stack}.final_layer_norm.weight', (d,))}
        for i in range(model[f'num_{stack}_layers']):
            layer = {}
            for j, name in enumerate(names):
                prefix = f'{stack}.block.{i}.layer.{j}'
                layer[f'{name}_norm'] = {'scale': read.take(f'{prefix}.layer_norm.weight', (d,))}
                if name == 'ffn':
                    gated = is_gated(model)
                    layer[name] = read.ffn(f'{prefix}.DenseReluDense', model['d_ff'], gated)
                else:
                    layer[name] = read.attention(f'{prefix}.{ATTENTION[name]}')
            params[f'{stack}_layer_{i}'] = layer
    return params


def nonzero_ffn_bias(params: dict[str, Any]) -> str | None:
    """The path of the first feed-forward bias of ``params`` that is not zero (T5's
    feed-forward has none), or None."""
    for name, layer in params.items():
        if 'ffn' not in layer:  # not a layer
            continue
        for proj, p in layer['ffn'].items():
            if 'bias' in p and np.any(np.asarray(p['bias']) != 0):
                return f'{name}/ffn/{proj}/bias'
    return None


def state_dict_from_params(params: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """T5's state dict (numpy, torch's layouts) of our parameter tree (one subtree per
    layer): the inverse of `params_from_state_dict`; the rows as they are."""
    d, n, h = model['d_model'], model['num_heads'], model['head_dim']
    shared = np.asarray(params['shared_embedding']['embedding'])
    state = {'shared.weight': shared}
    if 'logits_dense' in params:
        state['lm_head.weight'] = np.asarray(params['logits_dense']['kernel']).T
    for stack, names in SUBLAYERS.items():
        state[TABLE.format(stack=stack)] = np.asarray(params[f'{stack}_positions']['bias'])
        state[f'{stack}.final_layer_norm.weight'] = np.asarray(params[f'{stack}_norm']['scale'])
        for i in range(model[f'num_{stack}_layers']):
            layer = params[f'{stack}_layer_{i}']
            for j, name in enumerate(names):
                prefix = f'{stack}.block.{i}.layer.{j}'
                state[f'{prefix}.layer_norm.weight'] = np.asarray(layer[f'{name}_norm']['scale'])
                if name == 'ffn':
                    for proj, p in layer['ffn'].items():
                        kernel = np.asarray(p['kernel']).T
                        state[f'{prefix}.DenseReluDense.{proj}.weight'] = kernel
                    continue
                att = layer[name]
                for ours, t in (('query', 'q'), ('key', 'k'), ('value', 'v')):
                    kernel = np.asarray(att[ours]['kernel']).reshape(d, n * h)
                    state[f'{prefix}.{ATTENTION[name]}.{t}.weight'] = kernel.T
                out = np.asarray(att['out']['kernel']).reshape(n * h, d)
                state[f'{prefix}.{ATTENTION[name]}.o.weight'] = out.T
    return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}
