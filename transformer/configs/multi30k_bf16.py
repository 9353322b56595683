r"""Multi30k English -> German: multi30k_dropout02.py in bfloat16 with a 5000-token vocabulary.

bfloat16 compute (float32 parameters and Adam state) runs a training step ~1.5x faster on a CPU
with bfloat16 dot-product instructions (`transformer/backends/products.py`), which buys 6500 updates
instead of 5500 within the 90-minute budget. The joint vocabulary is 5000 tokens instead of
8000 (smaller subword vocabularies suit small corpora; the output layer is 3/8 smaller).
Everything else is multi30k_dropout02.py: dropout 0.2, the last 10 checkpoints averaged,
beam 5, length penalty alpha 1.4.

  python train.py --config configs/multi30k_bf16.py --workdir runs/multi30k_bf16 \
      --config.data.manual_dir=../shared/data/multi30k
  python -m transformer.evaluate --workdir runs/multi30k_bf16 --split test2016

Measured on a 2-vCPU AMD EPYC (README "Results"; benchmarks/results/multi30k_settings.md):
70 min 38 s for 6500 steps at ~1.6 steps/s; validation 40.63 (average of the last 10, beam 5,
alpha 1.4), 1.2 below multi30k_dropout02.py, and behind it at every in-training evaluation
(e.g. 38.1 vs 39.2 at step 4000), so test2016 was not scored.
"""

import ml_collections

from transformer.configs import multi30k_dropout02


def get_config() -> ml_collections.ConfigDict:
    config = multi30k_dropout02.get_config()
    config.model.dtype = 'bfloat16'  # compute dtype; parameters stay float32
    config.data.vocab_size = 5000
    config.train.num_steps = 6500
    return config
