"""The tensors of Hugging Face's M2M100 (NLLB-200's dense models too) and mBART, both ways,
from one table of names (`LAYER_NAMES`, `OUTER_NAMES`): each row names our parameter, theirs,
and the `Layout` that maps one onto the other, each layout difference described once there.

Which rows a model has is our model's to say (`transformer.model.param_shapes`: no
cross-attention in the encoder, mBART's embedding norms and learned positions, its output
bias), and every parameter it has is in the table (`names`). The vocabulary rows are the
directory's own ids (fairseq's dictionary: pad 1, eos 2, unk 3, no permutation), and every row
of the embedding is kept, those past the tokenizer's pieces too (NLLB-200's 256206).

Not in the table, by design:

* M2M100's sinusoid table (``model.{stack}.embed_positions.weights``): transformers computes
  it and does not save it; our model computes the same rows (``model.positions``
  'fairseq_sinusoidal'). A directory that stores one is checked against ours
  (`check_sinusoids`), not read: one that disagrees is refused.
* The tied copies of the embedding (``model.encoder.embed_tokens.weight``,
  ``model.decoder.embed_tokens.weight``, ``lm_head.weight``): ``tie_word_embeddings`` makes
  them one matrix with ``model.shared.weight``; any the directory stores must equal it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from transformer.interop.family import PretrainedError
from transformer.model import TransformerConfig, fairseq_sinusoids, param_shapes

Shape = tuple[int, ...]
STACKS = ('encoder', 'decoder')
SHARED = 'model.shared.weight'
# The names transformers ties to SHARED (tie_word_embeddings), in the order a stored copy is
# read where SHARED itself is not stored.
TIED = ('model.encoder.embed_tokens.weight', 'model.decoder.embed_tokens.weight', 'lm_head.weight')
# What transformers puts where a directory lacks a tensor it may lack: mBART's
# final_logits_bias is a buffer of zeros (its _keys_to_ignore_on_load_missing).
MAY_LACK = {'final_logits_bias': 0.0}
# M2M100's stored sinusoid table, where an older save kept it; its largest tolerated
# difference from ours (float32 sines of the same angles, or a float16 copy of them).
SINUSOIDS = 'model.{stack}.embed_positions.weights'
SINUSOID_ATOL = 1e-3


class FairseqError(PretrainedError):
    """An M2M100, NLLB-200 or mBART directory this project cannot read as asked; one line
    naming the file or key."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one of their tensors lays out one of our parameters.

    Attributes:
      what: the difference, in words.
      theirs: (our shape) -> their shape.
      to_ours: (their array, our shape) -> ours.
      to_theirs: (our array) -> theirs.
    """

    what: str
    theirs: Callable[[Shape], Shape]
    to_ours: Callable[[np.ndarray, Shape], np.ndarray]
    to_theirs: Callable[[np.ndarray], np.ndarray]


SAME = Layout('the same array', lambda s: s, lambda x, s: x, lambda x: x)
# torch's Linear stores [out, in]; our kernels are [in, out].
LINEAR = Layout('[out, in] transposed', lambda s: s[::-1], lambda x, s: x.T, lambda x: x.T)
# q/k/v: their [N * H, D] (the heads fused on the output axis) is our [D, N, H].
HEADS_IN = Layout(
    '[N * H, D] transposed, then its N * H axis split',
    lambda s: (s[1] * s[2], s[0]),
    lambda x, s: x.T.reshape(s),
    lambda x: x.reshape(x.shape[0], -1).T,
)
HEADS_BIAS = Layout(
    '[N * H] split', lambda s: (s[0] * s[1],), lambda x, s: x.reshape(s), lambda x: x.reshape(-1)
)
# out_proj: their [D, N * H] is our [N, H, D].
HEADS_OUT = Layout(
    '[D, N * H] transposed, then its N * H axis split',
    lambda s: (s[2], s[0] * s[1]),
    lambda x, s: x.T.reshape(s),
    lambda x: x.reshape(-1, x.shape[-1]).T,
)
# final_logits_bias is a buffer [1, V]; our logits bias is [V].
ROW = Layout('[1, V]: its one row', lambda s: (1, *s), lambda x, s: x[0], lambda x: x[None])
# mBART's learned positions [max_positions + 2, D] (MBartLearnedPositionalEmbedding) are our
# table as they are: position p reads row p + 2 in both; rows 0 and 1 are kept, never read.
LEARNED = dataclasses.replace(SAME, what='the same rows, position p at row p + 2')

# Within a layer: ours under '{stack}_layer_{i}/', theirs under 'model.{stack}.layers.{i}.'.
LAYER_NAMES: tuple[tuple[str, str, Layout], ...] = (
    tuple(
        row
        for ours, theirs in (('self_attention', 'self_attn'), ('cross_attention', 'encoder_attn'))
        for row in (
            *(
                (f'{ours}/{o}/kernel', f'{theirs}.{t}.weight', HEADS_IN)
                for o, t in (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj'))
            ),
            *(
                (f'{ours}/{o}/bias', f'{theirs}.{t}.bias', HEADS_BIAS)
                for o, t in (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj'))
            ),
            (f'{ours}/out/kernel', f'{theirs}.out_proj.weight', HEADS_OUT),
            (f'{ours}/out/bias', f'{theirs}.out_proj.bias', SAME),
        )
    )
    + tuple(
        row
        for ours, theirs in (
            ('self_attention_norm', 'self_attn_layer_norm'),
            ('cross_attention_norm', 'encoder_attn_layer_norm'),
            ('ffn_norm', 'final_layer_norm'),
        )
        for row in (
            (f'{ours}/scale', f'{theirs}.weight', SAME),
            (f'{ours}/bias', f'{theirs}.bias', SAME),
        )
    )
    + (
        ('ffn/wi/kernel', 'fc1.weight', LINEAR),
        ('ffn/wi/bias', 'fc1.bias', SAME),
        ('ffn/wo/kernel', 'fc2.weight', LINEAR),
        ('ffn/wo/bias', 'fc2.bias', SAME),
    )
)
# Outside the layers; '{stack}' is each stack's name.
OUTER_NAMES: tuple[tuple[str, str, Layout], ...] = (
    ('shared_embedding/embedding', SHARED, SAME),
    ('{stack}_norm/scale', 'model.{stack}.layer_norm.weight', SAME),
    ('{stack}_norm/bias', 'model.{stack}.layer_norm.bias', SAME),
    ('{stack}_embedding_norm/scale', 'model.{stack}.layernorm_embedding.weight', SAME),
    ('{stack}_embedding_norm/bias', 'model.{stack}.layernorm_embedding.bias', SAME),
    ('{stack}_positions/embedding', 'model.{stack}.embed_positions.weight', LEARNED),
    ('logits_bias', 'final_logits_bias', ROW),
)


def names(cfg: TransformerConfig) -> list[tuple[str, str, Layout]]:
    """The table's rows of the parameters ``cfg``'s model has: (our path, their name,
    layout), one per parameter.

    Raises:
      FairseqError: a parameter the table has no name for (a model option these families
        lack, which their config checks refuse first).
    """
    rows = {}
    for stack in STACKS:
        for i in range(getattr(cfg, f'num_{stack}_layers')):
            for ours, theirs, layout in LAYER_NAMES:
                rows[f'{stack}_layer_{i}/{ours}'] = (f'model.{stack}.layers.{i}.{theirs}', layout)
        for ours, theirs, layout in OUTER_NAMES:
            rows[ours.format(stack=stack)] = (theirs.format(stack=stack), layout)
    shapes = param_shapes(cfg)
    missing = [path for path in shapes if path not in rows]
    if missing:
        raise FairseqError(f'Our parameter {missing[0]} has no M2M100 or mBART tensor.')
    return [(path, *rows[path]) for path in shapes]


def _take(state: dict[str, np.ndarray], name: str, shape: Shape, where: str) -> np.ndarray:
    """Their tensor ``name`` of shape ``shape`` (the embedding: SHARED or a tied copy, every
    stored copy equal; a tensor of `MAY_LACK`: its value where it is not stored)."""
    stored = [n for n in ((name, *TIED) if name == SHARED else (name,)) if n in state]
    if not stored and name in MAY_LACK:
        return np.full(shape, MAY_LACK[name], np.float32)
    if not stored:
        raise FairseqError(f'{where} has no tensor {name}.')
    value = state[stored[0]]
    if value.shape != shape:
        raise FairseqError(
            f'{where}: {stored[0]} has shape {value.shape}, not {shape} as config.json says.'
        )
    for other in stored[1:]:
        if not np.array_equal(state[other], value):
            raise FairseqError(
                f'{where}: {other} differs from {stored[0]}: tie_word_embeddings makes them '
                'one matrix, so they must be equal.'
            )
    return value


def sinusoid_rows(rows: int, d_model: int, pad: int) -> np.ndarray:
    """M2M100SinusoidalPositionalEmbedding's table of ``rows`` rows as our model computes it
    (`fairseq_sinusoids`), the padding id's row zero."""
    table = np.array(fairseq_sinusoids(jnp.arange(rows), d_model))
    table[pad] = 0.0
    return table


def check_sinusoids(state: dict[str, np.ndarray], cfg: TransformerConfig, where: str) -> None:
    """A `FairseqError` for a stored M2M100 sinusoid table (`SINUSOIDS`) that is not the one
    our model computes: its positions would not be the directory's."""
    for stack in STACKS:
        name = SINUSOIDS.format(stack=stack)
        if name not in state:
            continue
        table = state[name]
        if table.ndim != 2 or table.shape[1] != cfg.d_model or table.shape[0] <= cfg.special.pad:
            raise FairseqError(
                f'{where}: {name} has shape {table.shape}, not [rows, d_model={cfg.d_model}].'
            )
        ours = sinusoid_rows(table.shape[0], cfg.d_model, cfg.special.pad)
        worst = float(np.abs(table - ours).max())
        if worst > SINUSOID_ATOL:
            raise FairseqError(
                f"{where}: {name} differs from fairseq's sinusoids by up to {worst:.3g}: "
                'M2M100 computes its positions, and this table is not what it computes.'
            )


def params_from_state_dict(
    state: dict[str, np.ndarray], cfg: TransformerConfig, where: str
) -> dict[str, Any]:
    """Our parameter tree (nested dicts of float32 arrays) from their tensors by the table
    (`names`); ``where`` names the file in errors. A stored M2M100 sinusoid table is checked
    (`check_sinusoids`), not read."""
    if cfg.positions == 'fairseq_sinusoidal':
        check_sinusoids(state, cfg, where)
    shapes = param_shapes(cfg)
    tree: dict[str, Any] = {}
    for path, theirs, layout in names(cfg):
        value = _take(state, theirs, layout.theirs(shapes[path]), where)
        *parents, leaf = path.split('/')
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = np.ascontiguousarray(layout.to_ours(value, shapes[path]), np.float32)
    return tree


def state_dict_from_params(params: dict[str, Any], cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """Their tensors from our parameter tree by the same table: the inverse of
    `params_from_state_dict`. The embedding is written once (SHARED; transformers ties the
    others to it); M2M100's sinusoids are not written (transformers computes them)."""
    state = {}
    for path, theirs, layout in names(cfg):
        value = params
        for key in path.split('/'):
            value = value[key]
        state[theirs] = np.ascontiguousarray(layout.to_theirs(np.asarray(value, np.float32)))
    return state
