"""Config errors: one line, exit code 2, nothing written to the workdir."""

import importlib
import sys

import jax
import pytest
from absl import flags

from configs import tiny
from transformer import configs
from transformer.commands import train as trainer
from transformer.training import config_checks


def _forget_config_overrides():
    for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)


@pytest.fixture(autouse=True)
def fresh_overrides():
    """ml_collections defines a flag per --config.KEY override; in one process a second
    parse of the same key would be a duplicate definition (each CLI run is its own process)."""
    _forget_config_overrides()
    yield
    _forget_config_overrides()


@pytest.mark.parametrize('name', configs.names())
def test_shipped_configs_pass(name):
    module = importlib.import_module(f'configs.{name}')  # the path form's one-line loader
    config_checks.check(module.get_config(), devices=jax.devices('cpu'))


@pytest.mark.parametrize(
    'override, message',
    [
        ('model.d_modle=8', 'unknown config key model.d_modle; did you mean model.d_model?'),
        ('model.d_model=abc', "invalid literal for int() with base 10: 'abc'"),
        ('model.dropout_rate=1.0', 'model.dropout_rate=1.0 must be in [0, 1).'),
        ('model.dropout_rate=-0.1', 'model.dropout_rate=-0.1 must be in [0, 1).'),
        ('opt.warmup_steps=0', 'opt.warmup_steps=0 must be an integer >= 1.'),
        ('opt.cooldown_steps=100000', 'opt.cooldown_steps=100000 exceeds train.num_steps='),
        ('eval.beam_size=0', 'eval.beam_size=0 must be an integer >= 1.'),
        ('train.label_smoothing=1.0', 'train.label_smoothing=1.0 must be in [0, 1).'),
        ('train.batch_size=12', 'train.batch_size=12 must be a multiple of data-parallel'),
        ('data.vocab_normalization=lower', "data.vocab_normalization='lower' must be one of"),
        ('model.num_heads=5', 'model.d_model=128 must be a multiple of model.num_heads=5'),
        ('model.head_dim=0', 'model.head_dim=0 must be an integer >= 1 (or None).'),
        (
            'model.attention_impl=flash',
            "model.attention_impl='flash' must be one of 'auto', 'einsum'",
        ),
        ('data.vocab_model_type=foo', "data.vocab_model_type='foo' must be one of 'bpe'"),
        ('data.synthetic.num_train=0', 'data.synthetic.num_train=0 must be >= 1.'),
        (
            'opt.schedule=cosine',
            "opt.schedule='cosine' must be one of 'rsqrt', 'constant', 'inverse_sqrt'.",
        ),
        ('train.seed=-1', 'train.seed=-1 must be >= 0.'),
        ('train.prefetch=-1', 'train.prefetch=-1 must be >= 0.'),
        ('train.early_stop_patience=-1', 'train.early_stop_patience=-1 must be >= 0.'),
        ('eval.best_metric=bleu', "eval.best_metric='bleu' must be one of 'sacrebleu'"),
    ],
)
def test_config_error_is_one_line_exit_2_and_writes_nothing(
    override, message, tmp_path, monkeypatch, capsys
):
    workdir = tmp_path / 'run'
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}', f'--config.{override}']
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its overrides from sys.argv
    # The command checks the batch against all devices: the 8 CPU ones, on every machine (a
    # GPU machine's default backend is its one GPU, which divides any batch).
    cpu_devices = jax.devices('cpu')
    monkeypatch.setattr(jax, 'devices', lambda backend=None: cpu_devices)
    with pytest.raises(SystemExit) as info:
        trainer.cli(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err
    assert not workdir.exists()


def test_wrong_type_in_a_config_file_is_named():
    config = tiny.get_config()
    del config.eval['beam_size']  # a ConfigDict keeps a field's type; replace the field
    config.eval.beam_size = '4'
    with pytest.raises(config_checks.ConfigError, match=r"eval.beam_size='4' must be of type int"):
        config_checks.check(config, devices=jax.devices('cpu')[:1])
