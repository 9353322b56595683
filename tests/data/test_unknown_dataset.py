"""A ``data.dataset`` that is none of the package's sources nor a TFDS dataset is named in one
line by the train command, with tensorflow-datasets (its registry of builders, no network)
and without it (where only the read, which needs it, can stop)."""

import sys

import pytest
from absl import flags

from transformer import data, schema
from transformer.commands import train
from transformer.data import sources, tfds_translate

HEAD = "data.dataset='{}' is not a source of this package (synthetic, multi30k, folder, none) nor"
INSTALL = "pip install 'transformer[tfds]' (from a checkout: pip install -e '.[tfds]')."


@pytest.fixture(autouse=True)
def fresh_overrides(monkeypatch):
    """ml_collections defines a flag per --config.KEY override: forget them between runs of
    the command in this process (as tests/test_bad_input.py does)."""

    def forget():
        for name in [n for n in flags.FLAGS if n.startswith('config.')]:
            delattr(flags.FLAGS, name)

    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    forget()
    yield
    forget()


def _train(dataset, tmp_path, monkeypatch, capsys):
    """The train command on configs/tiny.py with ``dataset``: (exit code, stderr lines)."""
    argv = [
        'train.py',
        '--config=tiny',
        f'--workdir={tmp_path}/run',
        f'--config.data.dataset={dataset}',
    ]
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its flags from sys.argv
    with pytest.raises(SystemExit) as info:
        train.cli(argv)
    code = info.value.code
    if isinstance(code, str):  # SystemExit('error: ...'): Python prints it and exits with 1
        print(code, file=sys.stderr)
        code = 1
    assert not (tmp_path / 'run').exists()
    return code, capsys.readouterr().err.strip().splitlines()


def _without_tfds(monkeypatch):
    def not_installed():
        raise data.DataError('Reading a TFDS dataset needs tensorflow-datasets: pip install ...')

    monkeypatch.setattr(tfds_translate, 'import_tfds', not_installed)


@pytest.mark.parametrize(
    'dataset, hint',
    [
        ('no_such_dataset_xyz', "TFDS's are named like 'wmt14_translate/de-en'."),
        ('multi31k', "did you mean 'multi30k'?"),
        ('wmt14_translat/de-en', "did you mean 'wmt14_translate/de-en'?"),
    ],
)
def test_with_tfds_the_config_check_names_it(dataset, hint, tmp_path, monkeypatch, capsys):
    pytest.importorskip('tensorflow_datasets', reason="needs the tfds extra: pip install '.[tfds]'")
    code, err = _train(dataset, tmp_path, monkeypatch, capsys)
    assert code == 2
    assert err == [f'error: {HEAD.format(dataset)} a TFDS dataset: {hint}']


@pytest.mark.parametrize(
    'dataset, hint',
    [
        ('no_such_dataset_xyz', f'to read one, {INSTALL}'),
        ('multi31k', f"did you mean 'multi30k'? To read a TFDS dataset, {INSTALL}"),
    ],
)
def test_without_tfds_the_read_names_it(dataset, hint, tmp_path, monkeypatch, capsys):
    _without_tfds(monkeypatch)
    code, err = _train(dataset, tmp_path, monkeypatch, capsys)
    assert code == 1
    assert err == [
        f'error: {HEAD.format(dataset)}, as far as can be told without tensorflow-datasets, '
        f'a TFDS dataset: {hint}'
    ]


def test_without_tfds_the_check_before_reading_says_nothing(monkeypatch):
    """A run of cached tokens may go on without tensorflow-datasets: only reading stops."""
    _without_tfds(monkeypatch)
    config = schema.default_config().data
    config.update(dataset='no_such_dataset_xyz')
    sources.check_dataset(config)
    with pytest.raises(data.DataError, match='as far as can be told without'):
        data.load_text(config, 'train')


def test_a_registered_tfds_name_passes_the_registry():
    pytest.importorskip('tensorflow_datasets', reason="needs the tfds extra: pip install '.[tfds]'")
    for name in ('wmt14_translate/de-en', 'wmt14_translate/de-en:1.0.0', 'ns:some_dataset'):
        assert tfds_translate.registered(name) is True, name
    assert tfds_translate.registered('no_such_dataset_xyz') is False
