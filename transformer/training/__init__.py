"""Training: the loop and everything it runs. Callers import its public API: ``from transformer
import training``; ``training.train_and_evaluate(config, workdir)``.

Modules:

- run_setup.py: `setup`, a run built or resumed in its work directory; `prepare_data`, its
  vocabulary and training token store alone.
- loop.py: `train_and_evaluate`, the loop over a run's steps.
- stops.py: why a run stops before its last step (non-finite values, Ctrl-C) and what it says.
- steps.py: the train state, the label-smoothed loss, gradient accumulation, the steps.
- loss.py: the cross-entropy fused with the output projection, a chunk of tokens at a time.
- rdrop.py: R-Drop's second dropout pass, its key and the two passes' symmetric KL.
- optim.py: the paper's learning-rate schedule and Adam (Sec. 5.3); AdamW's weight decay.
- parallel.py: `Parallel`, data (and tensor / FSDP) parallelism behind one interface.
- mesh.py: the ('data', 'model') mesh and which rows of the batch each process feeds.
- decode_layout.py: the mesh and parameter layout a run decodes on (validation, evaluate,
  translate), from its parallel settings.
- validation.py, best.py: validation loss and BLEU, the best checkpoint, early stopping.
  Checkpoints themselves are transformer/checkpoint/'s: the loop calls its `Checkpoints`.
- metrics.py: console lines, ``metrics.jsonl`` and TensorBoard events.
- config_checks.py: the config's values checked before a run writes anything.
- workdir_checks.py: the work directory, the start, the vocabulary and the mix's tags, checked
  before train or prepare writes anything.
- init_from.py: fine-tuning, a run that starts from a pretrained model's or another run's
  parameters.
- footprint.py: a lower bound on the memory a config needs, for training and decoding; the
  compiled train step against the memory left.
"""

from transformer.training.config_checks import (
    OUT_OF_MEMORY,
    TRAINING_OUT_OF_MEMORY,
)
from transformer.training.config_checks import check as check_config
from transformer.training.decode_layout import ParallelSettings, decode_layout, training_layout
from transformer.training.footprint import check_decoding
from transformer.training.footprint import needs as memory_needs
from transformer.training.loop import train_and_evaluate
from transformer.training.loss import fused_cross_entropy
from transformer.training.optim import make_optimizer
from transformer.training.parallel import Parallel
from transformer.training.run_setup import init_distributed, prepare_data, setup
from transformer.training.steps import (
    build_model,
    cross_entropy_with_smoothing,
    dropout_key,
    init_state,
    train_step,
)
from transformer.training.stops import Interrupted, TrainingError

__all__ = [
    'OUT_OF_MEMORY',
    'TRAINING_OUT_OF_MEMORY',
    'Interrupted',
    'Parallel',
    'ParallelSettings',
    'TrainingError',
    'build_model',
    'check_config',
    'check_decoding',
    'cross_entropy_with_smoothing',
    'decode_layout',
    'dropout_key',
    'fused_cross_entropy',
    'init_distributed',
    'init_state',
    'make_optimizer',
    'memory_needs',
    'prepare_data',
    'setup',
    'train_and_evaluate',
    'train_step',
    'training_layout',
]
