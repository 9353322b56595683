r"""Multi30k English -> German: two short runs trained side by side, decoded as one ensemble.

Each member is multi30k.py (d256, 3+3 layers, dropout 0.1, float32, 8000-token vocabulary)
with 1900 steps, the learning rate falling linearly to 0 over the last 700
(`opt.cooldown_steps`). The two members train at the same time, each process pinned to one
core (`taskset`): on a 2-core CPU two one-core steps take less time than two two-core steps
one after the other. The second member has another seed (initial parameters, dropout
masks, data order) and reads the first member's vocabulary; `evaluate --ensemble` decodes
both together (the mean of their next-token probabilities, each member its last
checkpoint: chosen on validation), beam 5.

  taskset -c 0 python train.py --config configs/multi30k_ensemble.py \
      --workdir runs/multi30k_ensemble_0 --config.data.manual_dir=../shared/data/multi30k &
  until [ -f runs/multi30k_ensemble_0/vocab/spm.model ]; do sleep 1; done
  taskset -c 1 python train.py --config configs/multi30k_ensemble.py \
      --workdir runs/multi30k_ensemble_1 --config.data.manual_dir=../shared/data/multi30k \
      --config.train.seed=1 --config.data.vocab_path=runs/multi30k_ensemble_0/vocab/spm.model &
  wait
  python -m transformer.evaluate --workdir runs/multi30k_ensemble_0 \
      --ensemble runs/multi30k_ensemble_1 --split test2016

Measured on an AVX2-only 2-vCPU AMD EPYC (README "Results";
benchmarks/results/multi30k_settings.md): 90 min 29 s for both members, from the first start
to the last end. Validation: 39.99 for the ensemble (step 1900, beam 5, alpha 1.4), 38.61 and
38.92 for the members alone; averaging the last 5 / 10 checkpoints gave 39.49 / 37.54. Below
multi30k_dropout02.py (41.83), so test2016 was not scored.
"""

import ml_collections

from transformer.configs import multi30k


def get_config() -> ml_collections.ConfigDict:
    config = multi30k.get_config()
    config.train.num_steps = 1900
    config.opt.cooldown_steps = 700  # lr falls linearly to 0 over steps 1200-1900
    config.train.keep_checkpoints = 10

    ev = config.eval
    ev.beam_size = 5
    ev.alpha = 1.4  # the multi30k_dropout02 runs' choice on validation
    ev.average_last = 1  # validation: 39.99 (last), 39.49 (5), 37.54 (10) for the ensemble
    ev.bleu_every = 950  # validation BLEU (beam 5) on 300 sentences, twice a run
    return config
