"""CTranslate2's T5 layout (``model.positions`` 't5_relative': T5 v1.0, v1.1, MADLAD-400),
what the CTranslate2 export (ctranslate2_spec.py) adds for it, as CTranslate2's own converter
(``converters/transformers.py``, T5Loader) writes a Hugging Face T5 directory:

* ``relative_attention_bias=True`` on each stack's spec: every self-attention holds its
  stack's table [buckets, heads] (ours, ``{stack}_positions/bias``, as it is) and
  ``relative_attention_max_distance`` (int32). CTranslate2 reads the number of buckets from
  the table's rows, buckets the encoder's distances both ways and the decoder's causally, and
  puts no bias on cross-attention, as ours. The equal tables of a stack's later layers are
  saved as aliases of the first layer's (the spec aliases equal variables).
* The unscaled logits (``model.attention_scale`` 1.0): ``queries_scale`` 1.0 on every
  attention, cross-attention included.
* The tied head's input rescale (``model.rescale_tied_head``, T5 v1.0): the decoder's
  ``scale_outputs`` d_model^-0.5. A head of its own (``share_embeddings`` 'inputs': v1.1,
  MADLAD-400) is ``logits_dense``, the decoder's projection, beside the shared input table.
* The tanh GELU gate (``model.ffn`` 'geglu_tanh', v1.1's 'gated-gelu'): ``GELUTanh`` with
  ``ffn_glu``; RMSNorm, pre-LN and no embedding scale are the export's general options.

No position table is written (the encoder spec declares none with a relative bias), and T5's
sources get no BOS; </s> closes them as ours (the vocabulary's eos, typed by the caller).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.formats import EVERY_VALUE, Writes

POSITIONS = 't5_relative'


def _attention_scale(cfg: Any) -> str | None:
    """CTranslate2 4.8 loads ``queries_scale`` with a relative bias (its T5 layout) only."""
    if cfg.attention_scale is None or (cfg.attention_scale == 1.0 and cfg.positions == POSITIONS):
        return None
    return (
        'the CTranslate2 export writes the logits scale 1/sqrt(head_dim), or 1.0 with '
        f"positions={POSITIONS!r} (T5's) only"
    )


# The fields the T5 layout adds to the CTranslate2 export's declaration (ctranslate2_spec.WRITES).
FIELDS = {
    'attention_scale': Writes(check=_attention_scale),
    'relative_attention_num_buckets': EVERY_VALUE,
    'relative_attention_max_distance': EVERY_VALUE,
    'rescale_tied_head': EVERY_VALUE,  # the config allows it with a tied head only
}


def options(cfg: Any) -> dict[str, Any]:
    """The stack spec options of the T5 layout (none for other positions)."""
    return {'relative_attention_bias': True} if cfg.positions == POSITIONS else {}


def weights(params: Any, cfg: Any) -> dict[str, np.ndarray]:
    """The variables of the T5 layout by their names in the spec (none for other
    positions): each self-attention's table and maximum distance, each attention's
    ``queries_scale``, the decoder's ``scale_outputs``."""
    if cfg.positions != POSITIONS:
        return {}
    out = {}
    distance = np.int32(cfg.relative_attention_max_distance)
    for stack in ('encoder', 'decoder'):
        table = np.ascontiguousarray(np.asarray(params[f'{stack}_positions']['bias'], np.float32))
        attentions = ('self_attention', 'attention') if stack == 'decoder' else ('self_attention',)
        for i in range(getattr(cfg, f'num_{stack}_layers')):
            scope = f'{stack}/layer_{i}/self_attention'
            out[f'{scope}/relative_attention_bias'] = table
            out[f'{scope}/relative_attention_max_distance'] = distance
            for attention in attentions:
                if cfg.attention_scale is not None:
                    out[f'{stack}/layer_{i}/{attention}/queries_scale'] = np.float32(
                        cfg.attention_scale
                    )
    if cfg.rescale_tied_head:
        out['decoder/scale_outputs'] = np.float32(cfg.d_model**-0.5)
    return out


def named_rows(pieces: list[str]) -> list[str]:
    """The pieces with a name for each row that has none: T5 v1.1 pads its ids to a multiple
    of 128 rows (32100 ids in 32128), rows no tokenizer names. CTranslate2's converter names
    them ``<extra_id_0>`` ... again, duplicates; here ``<extra_row_J>``, J counting them."""
    rows = iter(range(len(pieces)))
    return [piece or f'<extra_row_{next(rows)}>' for piece in pieces]
