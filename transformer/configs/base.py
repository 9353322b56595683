r"""The paper's base model on WMT14 English -> German (Vaswani et al., 2017, Table 3).

Command:

  python train.py --config configs/base.py --workdir runs/base
  python -m transformer.evaluate --workdir runs/base --average_last 5 --split test

Hardware: the paper trained 100k steps on 8 P100 GPUs in 12 hours (0.4 s/step) and reports
27.3 tokenized BLEU on newstest2014 (25.8 on newstest2013). Data: TFDS
`wmt14_translate/de-en` (train = the TFDS train split, validation = newstest2013, test =
newstest2014), trained English -> German with a joint ~37000-piece BPE SentencePiece model.
Each step holds ~25000 source + ~25000 target tokens: 104 packed rows of 256 tokens
(26624 target slots), split over the local devices (and `train.grad_accum_steps`).
"""

import ml_collections

from transformer import schema


def get_config() -> ml_collections.ConfigDict:
    # Every other field is at its default, which is the paper's (transformer/schema/, where
    # each field's default and description are written; --help prints them).
    config = schema.default_config()
    data = config.data
    data.dataset = 'wmt14_translate/de-en'  # TFDS; validation newstest2013, test newstest2014
    data.vocab_size = 37000  # joint source-target BPE vocabulary (Sec. 5.1)
    data.vocab_sample_size = 2_000_000  # sentences sampled to train SentencePiece
    data.max_len = 256  # packed row length (tokens)
    return config
