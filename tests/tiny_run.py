"""Small models, batches and configs shared by the tests of several modules."""

import numpy as np

from transformer import schema
from transformer.model import Transformer, TransformerConfig

VOCAB = 32
ROWS, LEN = 8, 12


def tiny_model(**overrides) -> Transformer:
    """A one-layer model of d_model 32; ``overrides`` replace TransformerConfig fields."""
    return Transformer(
        TransformerConfig(
            **{
                'vocab_size': VOCAB,
                'd_model': 32,
                'num_heads': 4,
                'd_ff': 64,
                'num_encoder_layers': 1,
                'num_decoder_layers': 1,
                'dropout_rate': 0.0,
                'attention_impl': 'einsum',  # the same path on every backend
                **overrides,
            }
        )
    )


# A warm-up under which the tiny model's parameters change in 3 steps (the base config's
# 4000 steps give it a learning rate of about 1e-6): for tests that compare trained runs.
LEARNING_WARMUP = 10


def tiny_parallel(
    devices,
    mode: str = 'sharding',
    model: Transformer | None = None,
    warmup_steps: int | None = None,
    **kwargs,
):
    """(`Parallel`, model, optimizer) of ``model`` (default `tiny_model()`) with the base
    config's optimizer (its ``warmup_steps`` replaced where given), label smoothing 0.1 and
    no accumulation unless ``kwargs`` say."""
    from transformer.configs import base
    from transformer.training import optim, parallel

    model = model or tiny_model()
    opt = base.get_config().opt
    if warmup_steps is not None:
        opt.warmup_steps = warmup_steps
    tx, schedule = optim.make_optimizer(opt, d_model=model.config.d_model)
    kwargs = {'label_smoothing': 0.1, 'accum_steps': 1, 'devices': devices, **kwargs}
    par = parallel.Parallel(mode, model=model, tx=tx, schedule=schedule, **kwargs)
    return par, model, tx


def packed_batch(seed: int) -> dict[str, np.ndarray]:
    """Rows of two packed examples each, with trailing padding of varying length."""
    rng = np.random.default_rng(seed)
    batch = {k: np.zeros((ROWS, LEN), np.int32) for k in ('inputs', 'targets')}
    for k in ('inputs', 'targets'):
        batch[f'{k}_segmentation'] = np.zeros((ROWS, LEN), np.int32)
        batch[f'{k}_positions'] = np.zeros((ROWS, LEN), np.int32)
    for row in range(ROWS):
        for k in ('inputs', 'targets'):
            first, second = rng.integers(2, 6, size=2)
            lengths = [first, second]
            offset = 0
            for segment, length in enumerate(lengths, start=1):
                tokens = rng.integers(3, VOCAB, size=length)
                tokens[-1] = 1  # EOS
                batch[k][row, offset : offset + length] = tokens
                batch[f'{k}_segmentation'][row, offset : offset + length] = segment
                batch[f'{k}_positions'][row, offset : offset + length] = np.arange(length)
                offset += length
    return batch


# The rows of a batch that tests decode a few lines in: a batch under 16 rows does not shrink
# as its examples finish (`decoding.next_token.stage_sizes`), so each search compiles one
# loop, not three (a batch of eval.batch_size's default 64 rows compiles three).
DECODE_BATCH = 8

# configs/tiny.py shrunk to seconds, as dotted config keys: applied by `tiny_run_config` and
# passed as --config.KEY=VALUE flags (`command_line`) by the tests that run train.py itself.
SMALL = {
    'model.d_model': 32,
    'model.num_heads': 4,
    'model.d_ff': 64,
    'model.num_encoder_layers': 1,
    'model.num_decoder_layers': 1,
    'data.max_len': 32,
    'data.synthetic.num_train': 200,
    'data.synthetic.num_validation': 20,
    'data.synthetic.num_test': 20,
    'data.vocab_size': 300,
    'train.batch_size': 8,
    'eval.batch_size': 16,
}


def command_line(overrides: dict) -> list[str]:
    """``--config.KEY=VALUE`` flags for ``python train.py --config=configs/tiny.py``."""
    return [f'--config.{key}={value}' for key, value in overrides.items()]


def tiny_run_config(num_steps: int):
    """configs/tiny.py shrunk to seconds: the same code path as the README command, without
    validation BLEU (``eval.bleu_every`` 0: the validation loss alone, no ``best/``)."""
    from transformer.configs import tiny

    config = tiny.get_config()
    overrides = {
        **SMALL,
        'model.dropout_rate': 0.1,  # exercise the dropout key path in resume
        'train.num_steps': num_steps,
        'train.log_every': 1,
        'train.eval_every': 0,
        'train.checkpoint_every': 3,
        'train.async_checkpointing': False,
        # No validation BLEU, the final one included: a beam-4 decode of an untrained model
        # runs to the length limit. The tests of BLEU, best/ and early stopping turn it on.
        'eval.bleu_every': 0,
    }
    config.update_from_flattened_dict(overrides)
    return config


def data_config(**overrides):
    """A small synthetic ``data`` section (600 training pairs, 500-piece vocabulary)."""
    config = schema.default_config().data
    config.synthetic.num_train = 600
    config.synthetic.num_validation = 70
    config.synthetic.num_test = 50
    config.vocab_size = 500
    config.update(overrides)
    return config


def run_dir_with(tmp_path, **model):
    """(workdir, config): a run directory under ``tmp_path`` holding config.json and an empty
    vocabulary file of `tiny_run_config` with ``model`` fields replaced, and that config."""
    from transformer import rundir

    config = tiny_run_config(1)
    config.model.update(model)
    workdir = tmp_path / 'run'
    workdir.mkdir(exist_ok=True)
    rundir.write_config(str(workdir), schema.parse(config))
    (workdir / 'vocab').mkdir(exist_ok=True)
    open(rundir.vocab_path(config, str(workdir)), 'w').close()
    return workdir, config


def file_hashes(root) -> dict[str, str]:
    """Every path under ``root`` (relative) -> the SHA-256 of a file's bytes, or 'directory':
    equal before and after a command that must change nothing there."""
    import hashlib
    import os

    found = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories:
            found[os.path.relpath(os.path.join(directory, name), root)] = 'directory'
        for name in files:
            file = os.path.join(directory, name)
            with open(file, 'rb') as f:
                found[os.path.relpath(file, root)] = hashlib.sha256(f.read()).hexdigest()
    return found
