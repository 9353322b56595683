"""What CTranslate2's encoder and decoder specs hold of a stack's input besides the token
table: the embedding scale, the position table each ``model.positions`` writes, and mBART's
norm of the embedding sum (``model.layernorm_embedding``), by their names in the spec.

CTranslate2 computes a stack's input as ours (transformer/model/transformer.py):
``embedding * scale_embeddings + position_encodings[p]``, then ``layernorm_embedding`` where
the spec has one, p counting from 0 at the first source token and at the decoder's start
token. So row p of the table written here is the vector our model adds at position p:

* 'sinusoidal': Sec. 3.5's interleaved sinusoids, row p = position p (no channel permuted);
* 'fairseq_sinusoidal' (M2M100, NLLB-200): fairseq's [sin | cos] rows from the padding id + 1,
  row p = fairseq's row p + pad + 1, as CTranslate2's own converter slices Hugging Face's
  table from its ``offset`` (``weights[offset:]``, offset = pad + 1 = 2);
* 'bart_learned' (mBART): the learned table without its two unread rows
  (``weight[offset:]``, offset 2: transformer/model/positions.py's LEARNED_OFFSET);
* 'rope': no table; the rotation is a spec option (ctranslate2_spec.spec_options).

A computed table has the rows asked for (CTranslate2 fails on a sequence longer than its
table); a learned one has its own, ``model.max_positions``, as Hugging Face's model has.
Padding's rows matter to neither: both mask padding out of attention.

The scale is written as the number it is, sqrt(D) or 1 (``model.scale_embedding``), as
CTranslate2's converter writes Hugging Face's ``embed_scale``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

STACKS = ('encoder', 'decoder')


def position_table(params: Any, cfg: Any, stack: str, rows: int) -> np.ndarray | None:
    """The table [rows or max_positions, D] float32 of ``stack`` ('encoder', 'decoder') that
    CTranslate2 adds at each position (module docstring); None for rotary positions.

    Args:
      params: the model's parameters (a learned table is read from them).
      cfg: its TransformerConfig.
      stack: 'encoder' or 'decoder'.
      rows: the rows of a computed table (the longest input CTranslate2 may read or write).
    """
    # jax: the exporting process's (the child that saves the spec never imports this).
    from transformer.model import fairseq_sinusoids, sinusoidal_positions

    if cfg.positions == 'sinusoidal':
        table = sinusoidal_positions(np.arange(rows), cfg.d_model)
    elif cfg.positions == 'fairseq_sinusoidal':
        table = fairseq_sinusoids(np.arange(rows) + cfg.special.pad + 1, cfg.d_model)
    elif cfg.positions == 'bart_learned':
        learned = np.asarray(params[f'{stack}_positions']['embedding'])
        table = learned[len(learned) - cfg.max_positions :]  # the rows before position 0 off
    else:
        return None
    return np.ascontiguousarray(np.asarray(table, np.float32))


def embedding_scale(cfg: Any) -> np.ndarray:
    """The number the embeddings are multiplied by: sqrt(D) (Sec. 3.4) or 1."""
    return np.float32(math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0)


def stack_inputs(params: Any, cfg: Any, rows: int) -> dict[str, np.ndarray]:
    """Each stack's scale, position table and embedding norm, by their names in the spec."""
    out = {}
    for stack in STACKS:
        out[f'{stack}/scale_embeddings'] = embedding_scale(cfg)
        table = position_table(params, cfg, stack, rows)
        if table is not None:
            out[f'{stack}/position_encodings/encodings'] = table
        if cfg.layernorm_embedding:
            norm = params[f'{stack}_embedding_norm']
            out[f'{stack}/layernorm_embedding/gamma'] = np.asarray(norm['scale'], np.float32)
            if 'bias' in norm:
                out[f'{stack}/layernorm_embedding/beta'] = np.asarray(norm['bias'], np.float32)
    return out
