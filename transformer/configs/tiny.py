r"""The offline quickstart: a tiny Transformer on the built-in synthetic translation task.

Command (no files, no network; a few minutes on a 2-core CPU):

  python train.py --config configs/tiny.py --workdir runs/tiny
  python -m transformer.evaluate --workdir runs/tiny

The synthetic language pair (transformer/data/synthetic.py) needs word translation, verb-final
reordering and agreement, so the model must learn to attend. Measured results are in the
README ("Results").

Variants (``--config configs/tiny.py:VARIANT``):

- (none): the paper's model at tiny widths.
- ``modern``: the parts of a later Transformer (`MODERN`): rotary positions, RMSNorm, pre-LN,
  a SwiGLU feed-forward at 2/3 of d_ff (so its three matrices hold the two of the ReLU one),
  QK-norm and 2 key/value heads for the 4 query heads (docs/model_variants.md).
"""

import ml_collections

from transformer.configs import base

# The model of a 2026 Transformer, as config keys; configs/multi30k.py:tiny_modern uses them.
MODERN = {
    'model.positions': 'rope',
    'model.norm': 'rms_norm',
    'model.pre_layer_norm': True,
    'model.ffn': 'swiglu',
    'model.qk_norm': True,
    'model.num_kv_heads': 2,
}
VARIANTS = {'': {}, 'modern': {**MODERN, 'model.d_ff': 168}}  # 2/3 x 256, a multiple of 8


def get_config(variant: str = '') -> ml_collections.ConfigDict:
    """The tiny config, or its ``variant`` (module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(
            f'configs/tiny.py has no variant {variant!r}: ' + ', '.join(map(repr, VARIANTS))
        )
    config = base.get_config()
    model = config.model
    model.d_model = 128
    model.num_heads = 4
    model.d_ff = 256
    model.num_encoder_layers = 2
    model.num_decoder_layers = 2
    model.dropout_rate = 0.0  # the task is noise-free and the model small: nothing to regularise

    data = config.data
    data.dataset = 'synthetic'
    data.vocab_size = 600  # about the number of word forms of the invented pair
    data.vocab_model_type = 'word'
    data.max_len = 64

    config.opt.warmup_steps = 200

    train = config.train
    train.num_steps = 800
    train.batch_size = 32
    train.log_every = 50
    train.eval_every = 400
    train.checkpoint_every = 200
    train.keep_checkpoints = 3

    ev = config.eval
    ev.average_last = 1
    ev.bleu_every = 400  # validation BLEU (beam 4) at steps 400 and 800
    ev.bleu_max_examples = 200
    ev.batch_size = 128
    ev.compound_split = False
    config.update_from_flattened_dict(VARIANTS[variant])
    return config
