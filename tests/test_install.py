"""Installed commands work from any directory: a wheel of this checkout, installed into a
fresh virtual environment, trains a packaged config found by name from a temporary cwd.

Offline and fast: the wheel is built without build isolation and installed without
dependencies; the new environment sees this interpreter's packages (jax, flax, ...) through a
.pth line, while `transformer` itself comes only from the wheel.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.subprocess_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every process here runs without PYTHONPATH: a checkout on it would stand in for the wheel
# (the packages it brings reach the new environment through its .pth line instead).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'XLA_FLAGS')}
# The installed command's training: one host CPU device, as without the suite's flags, and
# the suite's compiler settings (tests/conftest.py: its tiny programs compiled to compile fast).
TRAIN_ENV = {**CLEAN_ENV, 'XLA_FLAGS': xla_flags(1)}


def _run(*args, cwd=None, env=CLEAN_ENV, timeout=300):
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f'{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}'
    return done


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version('setuptools').split('.')[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which('git') is None, reason='needs git to copy the checkout')
@pytest.mark.skipif(
    _setuptools_major() < 77,
    reason='building the wheel offline needs setuptools>=77 here (the dev extra installs it)',
)
def test_installed_train_command_finds_config_by_name(tmp_path):
    # A copy of the working tree (ignored files left out): building in the checkout would
    # leave build/ behind.
    src = tmp_path / 'src'
    files = _run('git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard', cwd=REPO)
    tracked = files.stdout.split('\0')
    for name in filter(None, tracked):
        if os.path.exists(os.path.join(REPO, name)):
            os.makedirs(src / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), src / name)
    pip = (sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q')
    _run(*pip, 'wheel', '--no-deps', '--no-build-isolation', '-w', str(tmp_path), str(src))
    wheel = next(tmp_path.glob('transformer-*.whl'))
    # The licence pyproject.toml declares ships with it, and is that licence's text.
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith('.dist-info/METADATA')))
        licence = [n for n in names if n.endswith('.dist-info/licenses/LICENSE')]
        assert licence, names
        text = archive.read(licence[0]).decode()
    assert b'License-Expression: Apache-2.0' in metadata
    assert 'Apache License' in text and 'Version 2.0, January 2004' in text
    venv = tmp_path / 'venv'
    _run(sys.executable, '-m', 'venv', '--without-pip', str(venv))
    python = venv / 'bin' / 'python'
    _run(*pip, '--python', str(python), 'install', '--no-deps', str(wheel))
    site = _run(str(python), '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))')
    # This interpreter's packages, and those it gets through PYTHONPATH (a checkout of the
    # project there left out: `transformer` must come from the wheel).
    through_path = os.environ.get('PYTHONPATH', '').split(os.pathsep)
    base = [sysconfig.get_path('purelib')] + [
        p for p in through_path if p and not os.path.isdir(os.path.join(p, 'transformer'))
    ]
    with open(os.path.join(site.stdout.strip(), 'base_packages.pth'), 'w') as f:
        f.write(''.join(p + '\n' for p in base))

    cwd = tmp_path / 'elsewhere'
    cwd.mkdir()
    overrides = {
        'model.d_model': 16,
        'model.d_ff': 32,
        'model.num_heads': 2,
        'model.num_encoder_layers': 1,
        'model.num_decoder_layers': 1,
        'data.synthetic.num_train': 100,
        'data.synthetic.num_validation': 8,
        'data.synthetic.num_test': 8,
        'data.vocab_size': 300,
        'train.batch_size': 4,
        'train.num_steps': 2,
        'train.log_every': 1,
        'train.checkpoint_every': 2,
        'eval.bleu_every': 0,
    }
    _run(
        str(venv / 'bin' / 'transformer-train'),
        '--config',
        'tiny',
        '--workdir',
        'W',
        *(f'--config.{k}={v}' for k, v in overrides.items()),
        cwd=cwd,
        env=TRAIN_ENV,
    )
    assert (cwd / 'W' / 'checkpoints' / '2').is_dir()
    where = _run(str(python), '-c', 'import transformer; print(transformer.__file__)', cwd=cwd)
    assert where.stdout.startswith(site.stdout.strip())
    assert (venv / 'bin' / 'transformer-visualize').exists()
