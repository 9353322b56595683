"""Bad input stops before any work: each value that cannot work ends the train command in one
line naming its key, with exit code 2, before anything is written, within seconds.

Each table below is a list of cases anyone can extend: an override (or a config file) and
a piece of the one line it must give. The cases run the real train command in-process
(`trainer.cli`), so each takes a fraction of a second; one subprocess case (slow) checks the
installed entry point the same way.
"""

import dataclasses
import math
import os
import shutil
import subprocess
import sys
import time
import typing

import jax
import pytest
from absl import flags

from tests.tiny_run import SMALL, command_line
from transformer import configs, schema
from transformer.commands import train as trainer
from transformer.model import TransformerConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Values that exceed what any machine holds, so the memory check refuses them everywhere.
HUGE = 10**12


def _forget_config_overrides():
    for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)


@pytest.fixture(autouse=True)
def fresh_overrides(monkeypatch):
    """ml_collections defines a flag per --config.KEY override; a second parse of the same
    key in one process would be a duplicate definition. It also loads each config file as the
    module ``config_config``, into the namespace an earlier file of the process left."""
    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    _forget_config_overrides()
    yield
    _forget_config_overrides()


def _train(argv, monkeypatch, capsys) -> tuple[int, list[str], float]:
    """Runs the train command in-process: (exit code, stderr lines, seconds). The command
    checks batches and memory against all devices: the 8 CPU ones, on every machine (a GPU
    machine's default backend is its one GPU, which divides any batch)."""
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its overrides from sys.argv
    cpu_devices = jax.devices('cpu')
    monkeypatch.setattr(jax, 'devices', lambda backend=None: cpu_devices)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        trainer.cli(argv)
    seconds = time.perf_counter() - start
    return info.value.code, capsys.readouterr().err.strip().splitlines(), seconds


# (overrides, what the one line must say). `{tmp}` is the test's temporary directory.
BAD_OVERRIDES = [
    # Non-finite floats: they passed every lower bound and failed steps later.
    ('opt.lr_scale=inf', 'opt.lr_scale=inf must be a finite number.'),
    ('opt.lr_scale=nan', 'opt.lr_scale=nan must be a finite number.'),
    ('model.layer_norm_epsilon=nan', 'model.layer_norm_epsilon=nan must be a finite number.'),
    ('model.layer_norm_epsilon=inf', 'model.layer_norm_epsilon=inf must be a finite number.'),
    ('eval.alpha=inf', 'eval.alpha=inf must be a finite number.'),
    ('opt.b2=nan', 'opt.b2=nan must be a finite number.'),
    ('opt.eps=inf', 'opt.eps=inf must be a finite number.'),
    ('opt.clip_grad_norm=-inf', 'opt.clip_grad_norm=-inf must be a finite number.'),
    ('train.label_smoothing=nan', 'train.label_smoothing=nan must be a finite number.'),
    ('model.dropout_rate=nan', 'model.dropout_rate=nan must be a finite number.'),
    # Integers beyond what jax or the machine can take.
    ('train.seed=18446744073709551616', 'train.seed=18446744073709551616 must be <= 9223372'),
    ('train.num_steps=10000000000', 'train.num_steps=10000000000 must be <= 2147483647'),
    (f'data.max_len={HUGE}', f'data.max_len={HUGE}'),
    (f'train.batch_size={8 * HUGE}', f'train.batch_size={8 * HUGE}'),
    (f'model.d_model={HUGE}', f'model.d_model={HUGE}'),
    (f'model.d_ff={HUGE}', f'model.d_ff={HUGE}'),
    (f'data.vocab_size={HUGE}', f'data.vocab_size={HUGE} must be <= 2147483647'),
    (f'eval.extra_length={HUGE}', f'eval.extra_length={HUGE}'),
    (f'eval.batch_size={HUGE}', f'eval.batch_size={HUGE}'),
    ('eval.beam_size=100000', 'eval.beam_size=100000 exceeds data.vocab_size=300'),
    # Data settings, checked by the source that owns them.
    ('data.eval_split=nosuch', "no split 'nosuch' (data.eval_split)"),
    ('data.train_split=nosuch', "no split 'nosuch' (data.train_split)"),
    ('data.test_split=test2016', "no split 'test2016' (data.test_split)"),
    ('data.synthetic.max_words=0', 'data.synthetic.max_words=0 must be >= 3.'),
    ('data.synthetic.max_words=2', 'data.synthetic.max_words=2 must be >= 3.'),
    ('data.synthetic.num_validation=0', 'data.synthetic.num_validation=0 must be >= 1.'),
    ('data.synthetic.num_test=-5', 'data.synthetic.num_test=-5 must be >= 1.'),
    ('data.synthetic.seed=-1', 'data.synthetic.seed=-1 must be >= 0.'),
    (f'data.synthetic.num_train={HUGE}', f'data.synthetic.num_train={HUGE} must be <= 100_000_000'),
    ('data.dataset=folder', "dataset='folder' needs data.folder"),
    ('data.dataset=folder data.folder={tmp}', "Missing file for split 'train' (en)"),
    ('data.dataset=multi30k data.eval_split=val', "multi30k has no split 'val' (data.eval_split)"),
    ('data.dataset=multi30k data.test_split=test2016 data.source_lang=fr', "no language 'fr'"),
    # Key/value heads (model.num_kv_heads): a divisor of the heads, of which the model axis
    # holds a whole number.
    ('model.num_kv_heads=3', 'model.num_kv_heads=3 must divide model.num_heads=4: each'),
    ('model.num_kv_heads=0', 'model.num_kv_heads=0 must be an integer >= 1 (or None).'),
    (
        'model.num_kv_heads=1 train.model_parallelism=2 train.parallelism=sharding',
        'train.model_parallelism=2 does not divide model.num_kv_heads=1',
    ),
    # Cases that held before: they keep holding.
    ('model.d_modle=8', 'unknown config key model.d_modle; did you mean model.d_model?'),
    ('model.d_model=abc', "invalid literal for int() with base 10: 'abc'"),
    ('train.batch_size=12', 'train.batch_size=12 must be a multiple of data-parallel'),
    ('opt.warmup_steps=0', 'opt.warmup_steps=0 must be an integer >= 1.'),
    ('eval.beam_size=0', 'eval.beam_size=0 must be an integer >= 1.'),
    ('model.remat=layer', "model.remat='layer' must be one of 'none', 'full', 'dots'"),
]


@pytest.mark.parametrize('overrides, message', BAD_OVERRIDES)
def test_a_bad_override_is_one_line_exit_2_and_writes_nothing(
    overrides, message, tmp_path, monkeypatch, capsys
):
    workdir = tmp_path / 'run'
    base = command_line({**SMALL, 'train.num_steps': 2})
    extra = [f'--config.{o}'.replace('{tmp}', str(tmp_path)) for o in overrides.split()]
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}', *base, *extra]
    code, err, seconds = _train(argv, monkeypatch, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err
    assert not workdir.exists()
    assert seconds < 5


def test_a_bad_override_given_again_in_the_same_process_says_the_same(
    tmp_path, monkeypatch, capsys
):
    """A command that stopped at a bad --config.KEY value leaves ml_collections' flag for KEY
    defined; the next command of the process (tests, the Python API) given KEY again said
    "The flag 'config.KEY' is defined twice" instead of checking the value."""
    base = command_line({**SMALL, 'train.num_steps': 0})
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={tmp_path / "run"}', *base]
    said = [_train(argv, monkeypatch, capsys)[:2] for _ in range(2)]
    assert said[0] == said[1] == (2, ['error: train.num_steps=0 must be an integer >= 1.'])


@pytest.mark.parametrize(
    'workdir, message',
    [
        ('', '--workdir is empty.'),  # it was "No such file or directory", naming nothing
        ('{tmp}/file', '{tmp}/file is a file, not a directory: give --workdir the directory'),
    ],
)
def test_a_workdir_that_cannot_be_one_is_one_line(workdir, message, tmp_path, monkeypatch, capsys):
    (tmp_path / 'file').write_text('')
    workdir, message = (text.replace('{tmp}', str(tmp_path)) for text in (workdir, message))
    base = command_line({**SMALL, 'train.num_steps': 2})
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}', *base]
    code, err, _ = _train(argv, monkeypatch, capsys)
    assert code not in (0, None)
    err += [code] if isinstance(code, str) else []  # SystemExit('error: ...')
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file']


def _float_fields() -> list[str]:
    """Every float setting of the schema, the model's included: each must be finite."""
    keys = []
    for section, cls in [('model', TransformerConfig), *schema.SECTIONS.items()]:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if hints.get(field.name) in (float, float | None):
                keys.append(f'{section}.{field.name}')
    return keys


@pytest.mark.parametrize('key', _float_fields())
@pytest.mark.parametrize('value', [math.inf, -math.inf, math.nan])
def test_every_float_setting_refuses_non_finite_values(key, value):
    config = configs.load('tiny')
    section, name = key.split('.')
    config[section][name] = value
    with pytest.raises(schema.ConfigError, match=rf'^{key}=(-?inf|nan) must be'):
        schema.parse(config)


# (body of the config file, what the one line must say besides the file's name)
BAD_CONFIG_FILES = [
    ('def get_config():\n    return 42\n', 'get_config() returned int 42, not an'),
    ('def get_config():\n    return {"model": {}}\n', 'get_config() returned dict'),
    ('def get_config():\n    return None\n', 'get_config() returned NoneType'),
    ('def get_config():\n    return 1 / 0\n', 'division by zero'),
    ('def get_config():\n    raise ValueError("no such recipe")\n', 'ValueError: no such recipe'),
    ('x = 1\n', "has no attribute 'get_config'"),
    ('import nosuchmodule\n', "No module named 'nosuchmodule'"),
    ('def get_config(:\n', 'invalid syntax'),
]


@pytest.mark.parametrize('body, message', BAD_CONFIG_FILES)
def test_a_config_file_that_fails_is_one_line_naming_it(
    body, message, tmp_path, monkeypatch, capsys
):
    file = tmp_path / 'bad.py'
    file.write_text(body)
    argv = ['train.py', f'--config={file}', f'--workdir={tmp_path}/run']
    code, err, _ = _train(argv, monkeypatch, capsys)
    assert code == 2
    assert len(err) == 1 and 'bad.py' in err[0] and message in err[0], err
    assert not (tmp_path / 'run').exists()
    with pytest.raises(ValueError, match='bad.py'):  # the Python API's loader says the same
        configs.load(str(file))


def test_the_memory_check_passes_every_packaged_config_on_one_device():
    from transformer.training import config_checks

    for name in configs.names():
        config_checks.check(configs.load(name), devices=jax.devices()[:1])


@pytest.mark.slow
def test_a_bad_override_through_the_installed_command_line(tmp_path):
    """The same in a process of its own, as a user runs it."""
    workdir = tmp_path / 'run'
    argv = [sys.executable, 'train.py', '--config', 'configs/tiny.py', f'--workdir={workdir}']
    proc = subprocess.run(
        [*argv, '--config.opt.lr_scale=inf', f'--config.data.max_len={HUGE}'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ['error: opt.lr_scale=inf must be a finite number.']
    assert not workdir.exists()


# (command, flags, what the one line must say): decoding flags against a trained run.
BAD_DECODING_FLAGS = [
    ('evaluate', '--alpha=inf', 'flag --alpha=inf: not finite'),
    ('evaluate', '--alpha=nan', 'flag --alpha=nan: not finite'),
    ('translate', '--alpha=-inf', 'flag --alpha=-inf'),
    ('evaluate', '--beam_size=1000000', '--beam_size=1000000 exceeds the vocabulary of'),
    ('translate', '--beam_size=1000000', '--beam_size=1000000 exceeds the vocabulary of'),
    ('evaluate', f'--batch_size={HUGE}', f'--batch_size={HUGE} sentences x --beam_size=4'),
    ('translate', f'--batch_size={HUGE}', 'the decoder cache alone needs at least'),
    ('evaluate', '--split=nosuch', "The synthetic dataset has no split 'nosuch'"),
    ('evaluate', '--step=999', 'No checkpoint for step 999'),
    # The beam of --nbest K is at least K: it went unchecked into an out-of-memory error
    # that said to lower --batch_size or --beam_size.
    ('translate', '--nbest=1000000', '--nbest=1000000 exceeds the vocabulary of'),
    # The decoding layout: training's own check of a model axis (4 heads, 8 CPU devices or
    # one GPU), a process outside the count, a coordinator that never answers.
    ('evaluate', '--model_parallelism=8', 'train.model_parallelism=8 does not divide'),
    ('translate', '--model_parallelism=8', 'train.model_parallelism=8 does not divide'),
    ('evaluate', '--parallelism=pmap --fsdp', "need train.parallelism='sharding'"),
    (
        'evaluate',
        '--coordinator_address=localhost:1 --num_processes=2 --process_id=2',
        '--process_id=2 is not one of the 2 processes of --num_processes (0 .. 1)',
    ),
    (
        'translate',
        '--coordinator_address=localhost:1 --num_processes=2 --process_id=1 --init_timeout_s=1',
        'No coordinator answers at localhost:1 (--coordinator_address) after 1 s',
    ),
    ('evaluate', '--num_processes=2', 'needs --coordinator_address, --num_processes and'),
    # A format matplotlib cannot write: its traceback came after the model had run.
    ('visualize', '--out=attention.txt', '--out=attention.txt: cannot write .txt files'),
]


@pytest.mark.parametrize('command, flag, message', BAD_DECODING_FLAGS)
def test_a_bad_decoding_flag_is_one_line_before_the_decode(
    command, flag, message, run_dir, tmp_path, monkeypatch, capsys
):
    from transformer import evaluate, translate, visualize

    workdir = tmp_path / 'run'
    shutil.copytree(run_dir, workdir)  # the shared run, with what earlier tests wrote into it
    before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob('*'))
    if command == 'evaluate':
        cli, argv = evaluate.cli, ['evaluate', f'--workdir={workdir}', *flag.split()]
    elif command == 'visualize':
        cli, argv = visualize.cli, ['visualize', f'--workdir={workdir}', '--text=dinds .', flag]
    else:
        (tmp_path / 'in.txt').write_text('dinds bap koft .\n')
        cli, argv = translate.cli, ['translate', f'--workdir={workdir}', *flag.split()]
        argv += [f'--input={tmp_path}/in.txt', f'--output={tmp_path}/out.txt']
    monkeypatch.setattr(sys, 'argv', argv)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        cli(argv)
    code = info.value.code
    err = capsys.readouterr().err.strip().splitlines() + ([code] if isinstance(code, str) else [])
    assert code not in (0, None)
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err
    assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob('*')) == before
    assert not (tmp_path / 'out.txt').exists()
    assert time.perf_counter() - start < 10


def test_numpy_out_of_memory_is_one_line_with_the_hint():
    from transformer.commands import console

    error = MemoryError('Unable to allocate 58.2 TiB for an array with shape (10, 16)')
    assert console.out_of_memory_line(error, 'Lower --batch_size.') == (
        'out of memory: Unable to allocate 58.2 TiB for an array with shape (10, 16). '
        'Lower --batch_size.'
    )


class _Device:
    """A device as jax describes one, with the memory statistics it gives (or fails to)."""

    platform, device_kind = 'gpu', 'NVIDIA H100'

    def __init__(self, stats):
        self._stats = stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_the_memory_check_reads_an_accelerators_limit_and_skips_without_one():
    from transformer.training import footprint

    config = schema.parse(configs.load('tiny'))
    big = dataclasses.replace(config.data, max_len=10**9)
    huge = dataclasses.replace(config, data=big)
    devices = [_Device({'bytes_limit': 80 * 2**30})]
    with pytest.raises(schema.ConfigError, match=r'more than the 80.0 GiB of NVIDIA H100 memory'):
        footprint.check(huge, devices)
    footprint.check(config, devices)
    for stats in (None, {}, RuntimeError('no statistics')):  # no figure: no refusal
        assert footprint.device_bytes([_Device(stats)])[0] is None
