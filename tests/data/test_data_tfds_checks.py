"""A TFDS dataset's split keys and languages are checked before a command writes anything,
from what is known offline: a prepared builder's metadata or a WMT builder's declared
splits; where neither says, reading the split fails in one line."""

import pytest

from tests.test_bad_input import _train, fresh_overrides  # noqa: F401 (autouse fixture)
from tests.tiny_run import SMALL, command_line
from transformer import data, schema
from transformer.data import sources, tfds_translate

# The `tfds` extra; a machine without it skips these, as tests/data/test_data_sources.py does.
tfds = pytest.importorskip(
    'tensorflow_datasets', reason="needs the tfds extra: pip install -e '.[tfds]'"
)


@pytest.fixture
def offline(monkeypatch):
    """No network, whatever the machine has: downloads must fail fast, not be attempted."""
    monkeypatch.setattr(tfds_translate, 'network_reachable', lambda *args, **kwargs: False)


class SplitCheckToy(tfds.core.GeneratorBasedBuilder):
    """A tiny translation builder with splits of its own names, and no declared ``subsets``."""

    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.Translation(languages=('de', 'en'))
        )

    def _split_generators(self, dl_manager):
        return {'train': self._generate_examples(6), 'dev2020': self._generate_examples(3)}

    def _generate_examples(self, n):
        for i in range(n):
            yield str(i), {'en': f'line {i}', 'de': f'Zeile {i}'}


def _config(**overrides):
    config = schema.default_config().data
    config.update(overrides)
    return config


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob('*'))


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
    """The data_dir of a prepared `SplitCheckToy`."""
    data_dir = tmp_path_factory.mktemp('tfds')
    tfds.builder('split_check_toy', data_dir=str(data_dir)).download_and_prepare()
    return data_dir


def test_a_prepared_datasets_splits_are_checked_from_its_metadata(prepared, offline):
    good = dict(dataset='split_check_toy', data_dir=str(prepared), eval_split='dev2020')
    sources.check_dataset(_config(**good, test_split='dev2020'))
    for key in ('train_split', 'eval_split', 'test_split'):
        with pytest.raises(data.DataError) as error:
            sources.check_dataset(_config(**{**good, 'test_split': 'dev2020', key: 'trian'}))
        assert str(error.value) == (
            f"split_check_toy has no split 'trian' (data.{key}); splits: ['dev2020', 'train']."
        )
    with pytest.raises(data.DataError, match=r"no split 'test' \(split\); splits: \['dev2020'"):
        data.check_split(_config(**good), 'test')  # evaluate --split=test
    data.check_split(_config(**good), 'dev2020')
    with pytest.raises(data.DataError, match=r"no language 'fr' \(data.target_lang\)"):
        sources.check_dataset(_config(**good, test_split='dev2020', target_lang='fr'))
    targets = data.load_text(_config(**good), 'dev2020')[1]  # stored shuffled
    assert sorted(targets) == ['Zeile 0', 'Zeile 1', 'Zeile 2']


def test_a_wmt_builder_declares_its_splits_before_it_is_prepared(tmp_path, offline):
    config = _config(dataset='wmt14_translate/de-en', data_dir=str(tmp_path))
    sources.check_dataset(config)  # train, validation, test: the defaults
    config.eval_split = 'valid'
    with pytest.raises(data.DataError) as error:
        sources.check_dataset(config)
    assert str(error.value) == (
        "wmt14_translate/de-en has no split 'valid' (data.eval_split); "
        "splits: ['test', 'train', 'validation']."
    )
    assert _files(tmp_path) == []  # offline, nothing downloaded or prepared


def test_unknown_splits_are_left_to_the_read(tmp_path, offline, monkeypatch):
    """Neither prepared nor declaring its splits: no verdict before the read, which fails in
    one line; without tensorflow_datasets the check says nothing either."""
    config = _config(dataset='split_check_toy', data_dir=str(tmp_path), train_split='trian')
    sources.check_dataset(config)
    with pytest.raises(data.DataError, match='no network') as error:
        data.load_text(config, 'trian')
    assert '\n' not in str(error.value)

    def not_installed():
        raise data.DataError('Reading a TFDS dataset needs tensorflow-datasets: pip install ...')

    monkeypatch.setattr(tfds_translate, 'import_tfds', not_installed)
    sources.check_dataset(_config(dataset='wmt14_translate/de-en', train_split='trian'))


@pytest.mark.parametrize(
    'dataset, overrides, message',
    [
        (
            'wmt14_translate/de-en',
            ['data.train_split=trian'],
            "no split 'trian' (data.train_split)",
        ),
        ('wmt14_translate/de-en', ['data.test_split=newstest2014'], '(data.test_split); splits:'),
        ('wmt14_translate/de-en', ['data.source_lang=fr'], "no language 'fr' (data.source_lang)"),
        (
            'split_check_toy',
            ['data.test_split=dev2020'],  # eval_split: 'validation', which it lacks
            "no split 'validation' (data.eval_split); splits: ['dev2020', 'train'].",
        ),
    ],
)
def test_train_with_a_bad_tfds_split_is_one_line_and_writes_nothing(
    dataset, overrides, message, prepared, tmp_path, offline, monkeypatch, capsys
):
    workdir, before = tmp_path / 'run', _files(prepared)
    data_dir = prepared if dataset == 'split_check_toy' else tmp_path / 'tfds'
    flags = [f'data.dataset={dataset}', f'data.data_dir={data_dir}']
    flags = [f'--config.{flag}' for flag in [*flags, *overrides]]
    base = command_line({**SMALL, 'train.num_steps': 2})
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}', *base, *flags]
    code, err, _ = _train(argv, monkeypatch, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err
    assert f'{dataset} has no' in err[0]
    assert not workdir.exists() and not (tmp_path / 'tfds').exists()
    assert _files(prepared) == before
