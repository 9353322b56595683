r"""Multi30k English -> German (WMT16 multimodal task 1, text only), one config with variants.

  python train.py --config configs/multi30k.py:VARIANT --workdir runs/m30k \
      --config.data.manual_dir=../shared/data/multi30k
  python -m transformer.evaluate --workdir runs/m30k --split test2016

Variants (lowercased tokenized BLEU, as the published Multi30k results):

- (none): d256, 3+3 layers, dropout 0.1, 2800 steps of 32 packed rows of 64; about 1.5 h on a
  2-core CPU (README "Results").
- ``dropout02``: dropout 0.2, 5500 steps, the last 10 checkpoints averaged, beam 5, alpha 1.4;
  75 min on a 2-core CPU: validation 41.83, test2016 39.84.
- ``tiny``: the published Transformer-tiny recipe exactly (Wu et al., 2021): d128, 4+4 layers,
  4 heads, d_ff 256, dropout 0.3, warm-up 2000 steps to 0.005, 2 x 4096 target slots a step, a
  10k joint vocabulary, 8000 updates, the last 10 averaged, beam 5. One H100, 232 s of
  training: validation 42.35, test2016 40.55 (published: 41.02); three seeds on one H200
  (alpha 1.0): test2016 41.14 +- 0.71.
- ``tiny_cpu``: ``tiny``'s model and optimiser with 4096 slots a step and 5500 updates, what
  85 minutes of a 2-core CPU train: validation 39.99.
- ``tiny_fairseq``: ``tiny`` with what else the published run did as fairseq does it, one key
  each: Moses-tokenized, lowercased text (the dataset's ``*.lc.norm.tok`` files), fairseq's
  length penalty |y|^1, Adam eps 1e-8, clipping at norm 25, layer norm eps 1e-5, the
  ``inverse_sqrt`` schedule from 1e-7 to 0.005 over 2000 updates, and a checkpoint every 62
  updates (one epoch), so that the 10 averaged span the last 10 epochs. Three seeds on one
  H200: validation 42.36 +- 0.22 (tiny: 41.52 +- 0.33), test2016 40.52 +- 0.28.
- ``tiny_rdrop``: ``tiny`` with R-Drop (Liang et al., NeurIPS 2021) at ``train.rdrop_alpha``
  2.5, the paper's IWSLT'14 alpha 5 in this codebase's form (transformer/training/rdrop.py);
  the paper's IWSLT model has tiny's dropout, 0.3. Two passes a step: 2.5x a plain step on a
  2-core CPU (benchmarks/README.md).
- ``tiny_worddrop``: ``tiny`` with word dropout 0.1 on both sides (Sennrich, Haddow & Birch,
  2016, WMT16 EN<->RO: "drop out full words (both on the source and target side) with a
  probability of 0.1") and AdamW's decoupled weight decay 0.01 on the weight matrices
  (Loshchilov & Hutter, 2019; BERT's and PyTorch AdamW's 0.01). A step costs what ``tiny``'s
  does. Both candidates: a CPU pilot in docs/experiments.md; not yet trained in full.
- ``tiny_modern``: ``tiny``'s recipe with the parts of a later Transformer (configs/tiny.py
  `MODERN`): rotary positions, RMSNorm, pre-LN, SwiGLU at d_ff 168 (2/3 of 256: the same
  feed-forward parameters), QK-norm, 2 key/value heads for 4 query heads.

- ``finetune``: a pretrained model fine-tuned on Multi30k (``--config.train.init_from=PATH``, a
  MarianMT directory or a run directory, required; docs/pretrained.md): 1000 steps, fairseq's
  ``inverse_sqrt`` schedule to a peak of 4e-4 after 100 steps, cooled to 0 over the last 200.
  A MarianMT trained by Hugging Face's code on half of the training pairs (d128, 3+3, ending
  its own training at lr 3.7e-4; benchmarks/marian_finetune.sh), fine-tuned on the other half:
  test2016 sacreBLEU 22.64 -> 28.92 (peak 1e-4: 27.17; beam 4, the checkpoint's alpha 1.0
  'fairseq'); the same model from scratch on that half for the same 1000 steps: 27.50. A
  model trained to convergence wants a lower peak (docs/pretrained.md).

Earlier experiments stay reachable as variants (`EARLIER`: `bf16`, `dropout02_bf16`,
`cooldown`, `dropout03`, `ensemble`, `lowercase`); none beat `dropout02` on validation. Their
commands and figures are in docs/experiments.md. Each variant is its parent with the settings
its row of `VARIANTS` or `EARLIER` changes.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from transformer.configs import base
from transformer.configs.tiny import MODERN

# variant -> (parent variant or None for `_base`, {dotted key: value}).
VARIANTS: dict[str, tuple[str | None, dict[str, Any]]] = {
    '': (None, {}),
    'dropout02': (
        '',
        {
            'model.dropout_rate': 0.2,
            'train.num_steps': 5500,  # ~22 epochs; the rsqrt schedule ignores num_steps
            'train.keep_checkpoints': 15,  # room to compare averaging 5 / 10 / 15
            'eval.beam_size': 5,
            'eval.alpha': 1.4,  # chosen on validation: outputs run short at 0.6
            'eval.average_last': 10,
            'eval.bleu_every': 1000,  # validation BLEU (beam 5) on 300 sentences
        },
    ),
    'tiny_cpu': (
        'dropout02',
        {
            'model.d_model': 128,
            'model.num_heads': 4,
            'model.d_ff': 256,
            'model.num_encoder_layers': 4,
            'model.num_decoder_layers': 4,
            'model.dropout_rate': 0.3,
            'opt.warmup_steps': 2000,
            'opt.lr_scale': 2.5,  # peak 2.5 x 128^-0.5 x 2000^-0.5 = 0.0049, as 0.005 published
            'train.batch_size': 64,  # packed rows of 64: ~4k target tokens a step
        },
    ),
    'tiny': (
        'tiny_cpu',
        {
            'train.batch_size': 128,  # 8192 target slots a step: the published 2 x 4096
            'data.vocab_size': 10_000,  # the published joint vocabulary
            'train.num_steps': 8000,  # the published updates
        },
    ),
    'tiny_fairseq': (
        'tiny',
        {
            'data.pretokenize': 'moses',  # the published *.lc.norm.tok text
            'data.vocab_normalization': 'nmt_nfkc_cf',  # lowercased, as that text is
            'eval.best_metric': 'tokenized_bleu',  # lowercase output scores ~0 on cased metrics
            'eval.length_penalty': 'fairseq',  # score / |y|^alpha (sequence_generator)
            'eval.alpha': 1.0,  # fairseq's --lenpen default
            'opt.eps': 1e-8,  # fairseq's --adam-eps default
            'opt.clip_grad_norm': 25.0,  # fairseq's --clip-norm default then
            'model.layer_norm_epsilon': 1e-5,  # torch's LayerNorm default
            'opt.schedule': 'inverse_sqrt',  # fairseq's: the peak is the lr itself
            'opt.warmup_init_lr': 1e-7,  # fairseq's --warmup-init-lr default
            'opt.lr_scale': 5e-3,  # --lr 0.005
            'train.checkpoint_every': 62,  # one epoch of 2 x 4096 tokens
            'train.keep_checkpoints': 15,  # tiny's: room for the 10 averaged
            'eval.average_last': 10,  # tiny's: fairseq's --num-epoch-checkpoints 10
        },
    ),
    'tiny_rdrop': ('tiny', {'train.rdrop_alpha': 2.5}),
    'finetune': (
        '',
        {
            # A pretrained model's parameters (train.init_from, required: without one training
            # stops before it writes): a learning rate near what it ended its own training
            # with, not the paper's warm-up peak from scratch.
            'train.init_from_required': True,
            'opt.schedule': 'inverse_sqrt',
            'opt.lr_scale': 4e-4,  # the peak itself; 1e-4 gained a tenth as much (docstring)
            'opt.warmup_steps': 100,
            'opt.warmup_init_lr': 1e-7,
            'opt.cooldown_steps': 200,  # to 0 over the last 200 steps
            'opt.eps': 1e-8,
            'train.num_steps': 1000,
            'train.eval_every': 250,
            'eval.bleu_every': 500,
        },
    ),  # the paper's 5 with summed CEs
    'tiny_modern': ('tiny', {**MODERN, 'model.d_ff': 168}),  # configs/tiny.py's `MODERN`
    'tiny_worddrop': (
        'tiny',
        {
            'model.token_dropout_rate': 0.1,  # Sennrich et al. (2016)'s word dropout
            'opt.weight_decay': 0.01,  # AdamW on the weight matrices (training/optim.py)
        },
    ),
}
EARLIER: dict[str, tuple[str | None, dict[str, Any]]] = {
    'bf16': (
        'dropout02',
        {'model.dtype': 'bfloat16', 'data.vocab_size': 5000, 'train.num_steps': 6500},
    ),
    'dropout02_bf16': ('dropout02', {'model.dtype': 'bfloat16', 'train.num_steps': 6300}),
    'cooldown': (
        'dropout02',
        {
            'model.attention_dropout_rate': 0.1,
            'train.num_steps': 6000,
            'opt.cooldown_steps': 2000,  # lr falls linearly to 0 over steps 4000-6000
        },
    ),
    'dropout03': (
        '',
        {
            'model.dropout_rate': 0.3,
            'model.attention_dropout_rate': 0.1,
            'model.relu_dropout_rate': 0.1,
            'train.num_steps': 5000,
            'train.keep_checkpoints': 20,
            'eval.beam_size': 5,
            'eval.average_last': 10,
            'eval.bleu_every': 1000,
        },
    ),
    'ensemble': (
        '',
        {
            'train.num_steps': 1900,
            'opt.cooldown_steps': 700,  # lr falls linearly to 0 over steps 1200-1900
            'train.keep_checkpoints': 10,
            'eval.beam_size': 5,
            'eval.alpha': 1.4,
            'eval.average_last': 1,  # each member's last checkpoint (chosen on validation)
            'eval.bleu_every': 950,
        },
    ),
    'lowercase': (
        'dropout02',
        {
            'data.vocab_normalization': 'nmt_nfkc_cf',  # lowercases; keeps the German sharp s
            'train.num_steps': 6000,
            'eval.best_metric': 'tokenized_bleu',  # lowercase output scores ~0 on cased metrics
        },
    ),
}


def _base() -> ml_collections.ConfigDict:
    """The base config shrunk to Multi30k's short captions (the variant '')."""
    config = base.get_config()
    model = config.model
    model.d_model = 256
    model.num_heads = 4
    model.d_ff = 1024
    model.num_encoder_layers = 3
    model.num_decoder_layers = 3

    data = config.data
    data.dataset = 'multi30k'
    data.test_split = 'test2016'
    data.vocab_size = 8000  # joint BPE over ~29k short caption pairs
    data.vocab_sample_size = 58_000  # every train sentence of both languages
    data.max_len = 64  # captions are short; most rows pack 3-5 pairs

    config.opt.warmup_steps = 1000

    train = config.train
    train.num_steps = 2800  # ~11 epochs of Multi30k (~1.5 h on a 2-core CPU)
    train.batch_size = 32  # packed rows of 64 (~1.9k target tokens per step)
    train.log_every = 50
    train.eval_every = 400
    train.checkpoint_every = 100

    ev = config.eval
    ev.bleu_every = 800  # validation BLEU (beam 4) on 300 sentences
    ev.bleu_max_examples = 300
    ev.compound_split = False
    ev.lowercase_tokenized = True  # the convention of the published Multi30k results
    return config


def get_config(variant: str = '') -> ml_collections.ConfigDict:
    """The config of ``variant`` (module docstring); '' is the base Multi30k config."""
    table = VARIANTS | EARLIER
    if variant not in table:
        raise ValueError(
            f'configs/multi30k.py has no variant {variant!r}: '
            + ', '.join(repr(v) for v in VARIANTS)
            + ' (earlier experiments: '
            + ', '.join(EARLIER)
            + ').'
        )
    parent, settings = table[variant]
    config = _base() if parent is None else get_config(parent)
    config.update_from_flattened_dict(settings)
    return config
