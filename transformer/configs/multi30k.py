r"""A small Transformer for Multi30k English -> German (WMT16 multimodal task 1, text only).

Command (the raw files are read from data.manual_dir where there is no internet):

  python train.py --config configs/multi30k.py --workdir runs/multi30k \
      --config.data.manual_dir=../shared/data/multi30k
  python -m transformer.evaluate --workdir runs/multi30k --split test2016

Results measured with this config are in the README ("Results"). For reference, the published
text-only Transformer reaches 41.0 lowercased tokenized BLEU on test2016 (Wu et al., 2021).
"""

import ml_collections

from transformer.configs import base


def get_config() -> ml_collections.ConfigDict:
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
    train.keep_checkpoints = 5

    ev = config.eval
    ev.average_last = 5
    ev.bleu_every = 800  # validation BLEU (beam 4) on 300 sentences
    ev.bleu_max_examples = 300
    ev.compound_split = False
    ev.lowercase_tokenized = True  # the convention of the published Multi30k results
    return config
