"""Test set-up: 8 host CPU devices so that pmap and sharding are testable, quiet TensorFlow,
and one tiny trained run shared by the tests of the commands that read a run directory.

Both variables must be set before jax (or tensorflow) is first imported.
"""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # noqa: E402


@pytest.fixture(scope='session')
def run_dir(tmp_path_factory):
    """A tiny synthetic training run with checkpoints at steps 2 and 4."""
    from tests.tiny_run import tiny_run_config
    from transformer import trainer

    config = tiny_run_config(4)
    config.train.checkpoint_every = 2
    workdir = tmp_path_factory.mktemp('run')
    trainer.train_and_evaluate(config, str(workdir))
    return workdir
