"""Trains a Transformer: ``python train.py --config configs/tiny.py --workdir runs/tiny``.

Override any config field on the command line, e.g. ``--config.opt.warmup_steps=8000``.
Running the same command again resumes from the latest checkpoint in the workdir.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # before TensorFlow is imported

from transformer.commands import train  # noqa: E402

if __name__ == '__main__':
    train.cli()
