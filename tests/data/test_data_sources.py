"""Data sources: a folder, TFDS (mocked wmt14), Multi30k, and fast failures without network."""

import gzip
import os
import pathlib
import time

import pytest

from transformer import data, schema
from transformer.data import multi30k, tfds_translate

# Most of these read through TFDS (the `tfds` extra); a machine without it skips them.
tfds = pytest.importorskip(
    'tensorflow_datasets', reason="needs the tfds extra: pip install -e '.[tfds]'"
)

# The real Multi30k raw files live in the `shared` folder beside the repository.
MULTI30K_DIR = pathlib.Path(
    os.environ.get(
        'MULTI30K_DIR', pathlib.Path(__file__).parents[3] / 'shared' / 'data' / 'multi30k'
    )
)


def _config(**overrides):
    config = schema.default_config().data
    config.update(overrides)
    return config


@pytest.fixture
def offline(monkeypatch):
    """No network, whatever the machine has: downloads must fail fast, not be attempted."""
    monkeypatch.setattr(tfds_translate, 'network_reachable', lambda *args, **kwargs: False)


def _write(path, lines, compress=False):
    text = ''.join(line + '\n' for line in lines)
    if compress:
        with gzip.open(path, 'wt', encoding='utf-8') as f:
            f.write(text)
    else:
        path.write_text(text, encoding='utf-8')


def test_folder_both_namings(tmp_path):
    _write(tmp_path / 'train.en', ['Hello world.', 'A second line.'])
    _write(tmp_path / 'train.de', ['Hallo Welt.', 'Eine zweite Zeile.'])
    _write(tmp_path / 'en.dev.txt', ['Only one.'])  # TFDS TranslateFolder naming
    _write(tmp_path / 'de.dev.txt', ['Nur eine.'])
    config = _config(dataset='folder', folder=str(tmp_path))
    assert data.load_text(config, 'train') == (
        ['Hello world.', 'A second line.'],
        ['Hallo Welt.', 'Eine zweite Zeile.'],
    )
    assert data.load_text(config, 'dev') == (['Only one.'], ['Nur eine.'])
    reverse = _config(dataset='folder', folder=str(tmp_path), source_lang='de', target_lang='en')
    assert data.load_text(reverse, 'dev') == (['Nur eine.'], ['Only one.'])


def test_folder_errors(tmp_path):
    _write(tmp_path / 'train.en', ['a', 'b'])
    _write(tmp_path / 'train.de', ['a'])
    config = _config(dataset='folder', folder=str(tmp_path))
    with pytest.raises(data.DataError, match='aligned'):
        data.load_text(config, 'train')
    with pytest.raises(data.DataError, match=r'test\.en or .*en\.test\.txt'):
        data.load_text(config, 'test')
    with pytest.raises(data.DataError, match='data.folder'):
        data.load_text(_config(dataset='folder'), 'train')


def test_folder_trains_end_to_end(tmp_path):
    words = 'the a cat dog sees runs big small house tree'.split()
    lines = [' '.join(words[(i * k) % 10] for k in range(1, 2 + i % 6)) for i in range(60)]
    _write(tmp_path / 'train.en', lines)
    _write(tmp_path / 'train.de', [line.upper() for line in lines])
    config = _config(dataset='folder', folder=str(tmp_path), vocab_size=60, max_len=16)
    tokenizer = data.get_tokenizer(config, str(tmp_path / 'work' / 'spm.model'))
    batch = next(data.make_train_iterator(config, tokenizer, batch_size=2, seed=0))
    assert batch['inputs'].shape == (2, 16) and (batch['inputs_segmentation'] > 0).any()


def test_unknown_dataset_fails_fast():
    start = time.perf_counter()
    with pytest.raises(data.DataError, match=r"nor a TFDS dataset: .*'wmt14_translate/de-en'\.$"):
        data.load_text(_config(dataset='no_such_dataset'), 'train')
    with pytest.raises(data.DataError, match="did you mean 'multi30k'"):
        data.load_text(_config(dataset='multi31k'), 'train')
    with pytest.raises(data.DataError, match='Cannot build'):
        data.load_text(_config(dataset='wmt14_translate/xx-en'), 'train')
    with pytest.raises(data.DataError, match='no split'):
        data.load_text(_config(), 'test2016')
    assert time.perf_counter() - start < 5


def test_tfds_dataset_without_network_fails_fast(tmp_path, offline):
    config = _config(dataset='wmt14_translate/de-en', data_dir=str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(data.DataError, match='no network') as error:
        data.load_text(config, 'train')
    assert time.perf_counter() - start < 5
    assert '\n' not in str(error.value) and 'data.data_dir' in str(error.value)
    with pytest.raises(data.DataError, match="no language 'fr'"):
        data.load_text(_config(dataset='wmt14_translate/de-en', target_lang='fr'), 'train')


def test_network_probe_gives_up_quickly():
    start = time.perf_counter()
    assert not tfds_translate.network_reachable(('unreachable.invalid',), timeout=1.0)
    assert time.perf_counter() - start < 2


def test_mocked_wmt14_english_to_german(tmp_path, offline):
    """tfds.testing.mock_data stands in for the prepared dataset: even offline, no error."""

    def as_dataset(self, split, **kwargs):
        import tensorflow as tf

        n = 30 if split == 'train' else 7
        return tf.data.Dataset.from_tensor_slices(
            {
                'de': [f'Satz {i} auf Deutsch {split}' for i in range(n)],
                'en': [f'Sentence {i} in English {split}' for i in range(n)],
            }
        )

    config = _config(dataset='wmt14_translate/de-en', data_dir=str(tmp_path), vocab_size=80)
    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        train = data.load_text(config, 'train')
        tokenizer = data.get_tokenizer(config, str(tmp_path / 'work' / 'spm.model'))
        iterator = data.make_train_iterator(config, tokenizer, batch_size=2, seed=0)
        batches = data.make_eval_batches(config, tokenizer, 'test', batch_size=4)
    assert (
        train[0][3] == 'Sentence 3 in English train' and train[1][3] == 'Satz 3 auf Deutsch train'
    )
    assert len(train[0]) == 30
    assert next(iterator)['targets'].shape == (2, config.max_len)
    texts = data.restore_order(
        batches, [[tokenizer.decode(r) for r in b['targets']] for b in batches]
    )
    assert texts == [f'Satz {i} auf Deutsch test' for i in range(7)]


def test_mocked_wmt14_random_examples(offline):
    with tfds.testing.mock_data(num_examples=5):
        sources_, targets = data.load_text(_config(dataset='wmt14_translate/de-en'), 'validation')
    assert len(sources_) == len(targets) == 5 and all(isinstance(s, str) for s in sources_)


def _tiny_multi30k(root):
    root.mkdir()
    for stem, n in (('train', 6), ('val', 3), ('test_2016_flickr', 2), ('test_2017_mscoco', 2)):
        for lang in ('en', 'de'):
            _write(root / f'{stem}.{lang}.gz', [f'{stem} {lang} {i}' for i in range(n)], True)


def test_multi30k_from_manual_files_reads_them_directly(tmp_path, offline):
    """Raw files in data.manual_dir are read as they are (file order, raw text), without
    preparing anything in data.data_dir."""
    _tiny_multi30k(tmp_path / 'manual')
    config = _config(
        dataset='multi30k', manual_dir=str(tmp_path / 'manual'), data_dir=str(tmp_path / 'tfds')
    )
    assert data.load_text(config, 'train') == (
        [f'train en {i}' for i in range(6)],
        [f'train de {i}' for i in range(6)],
    )
    assert data.load_text(config, 'mscoco2017')[1] == [
        'test_2017_mscoco de 0',
        'test_2017_mscoco de 1',
    ]
    assert not (tmp_path / 'tfds').exists()
    with pytest.raises(data.DataError, match='no split'):
        data.load_text(config, 'test2018')


def test_multi30k_tfds_builder_gives_the_same_text(tmp_path, offline):
    """The TFDS builder (for downloads and TFDS users), prepared from the same files, reads
    back the same text in the same order; once prepared, no files or network are needed."""
    from transformer.data.multi30k_tfds import Multi30k

    _tiny_multi30k(tmp_path / 'manual')
    direct = _config(dataset='multi30k', manual_dir=str(tmp_path / 'manual'))
    builder = Multi30k(data_dir=str(tmp_path / 'tfds'), file_format='tfrecord')
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=str(tmp_path / 'manual'))
    )
    prepared = _config(dataset='multi30k', data_dir=str(tmp_path / 'tfds'))
    for split in ('train', 'validation', 'test2016', 'mscoco2017'):
        assert data.load_text(prepared, split) == data.load_text(direct, split)


def test_multi30k_missing_files_fail_fast(tmp_path, offline):
    (tmp_path / 'manual').mkdir()
    _write(tmp_path / 'manual' / 'train.en', ['a'])
    config = _config(
        dataset='multi30k', manual_dir=str(tmp_path / 'manual'), data_dir=str(tmp_path / 'tfds')
    )
    start = time.perf_counter()
    with pytest.raises(data.DataError) as error:
        data.load_text(config, 'train')
    assert time.perf_counter() - start < 5
    message = str(error.value)
    assert '\n' not in message and str(tmp_path / 'manual') in message
    assert all(name in message for name in multi30k.expected_files())


@pytest.mark.skipif(
    not (MULTI30K_DIR / 'train.en').is_file(),
    reason=f'Multi30k raw files not found in {MULTI30K_DIR} (set MULTI30K_DIR)',
)
def test_real_multi30k(tmp_path, offline):
    config = _config(dataset='multi30k', manual_dir=str(MULTI30K_DIR))
    lines = {
        name: (MULTI30K_DIR / name).read_text(encoding='utf-8').split('\n')[:-1]
        for name in ('val.en', 'val.de', 'test2016.en', 'test2016.de')
    }
    for split, stem, count in (('validation', 'val', 1014), ('test2016', 'test2016', 1000)):
        en, de = data.load_text(config, split)
        assert len(en) == len(de) == count
        assert en == lines[f'{stem}.en'] and de == lines[f'{stem}.de']  # file order, raw text
    en, de = data.load_text(config, 'train')
    assert len(en) == len(de) == 29000
    assert en[0] == 'Two young, White males are outside near many bushes.'
    reverse = _config(
        dataset='multi30k', manual_dir=str(MULTI30K_DIR), source_lang='de', target_lang='en'
    )
    assert data.load_text(reverse, 'test2016') == (lines['test2016.de'], lines['test2016.en'])


def test_a_new_source_is_one_module_and_one_registry_line(monkeypatch):
    """A module with read / identity / KEYS, registered under a name, is a dataset:
    its text loads, its config keys exist, and its identity keys the token cache."""
    import types

    from transformer.data import sources, tokenized

    fake = types.ModuleType('fake_source')
    fake.KEYS = {'fake_size': (3, int, 'sentences of each split')}
    fake.read = lambda cfg, split: ([f'{split} {i}' for i in range(cfg.fake_size)],) * 2
    fake.identity = lambda cfg, split: {'size': cfg.fake_size}
    monkeypatch.setitem(sources.SOURCES, 'fake', fake)
    config = _config(dataset='fake')
    assert config.fake_size == 3
    assert data.load_text(config, 'dev') == (['dev 0', 'dev 1', 'dev 2'],) * 2

    class Vocab:
        fingerprint = 'v'

    key = tokenized.cache_key(config, Vocab(), 'dev')
    config.fake_size = 4
    assert tokenized.cache_key(config, Vocab(), 'dev') != key


class ShuffledToy(tfds.core.GeneratorBasedBuilder):
    """A TFDS builder stored shuffled, keyed like TFDS's WMT builders ('<set>/<file>/<line>')."""

    VERSION = tfds.core.Version('1.0.0')
    subsets = {'test': ['toytest2014'], 'train': ['a', 'b']}  # as WmtTranslate.subsets

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.Translation(languages=('de', 'en')),
            supervised_keys=('en', 'de'),
        )

    def _split_generators(self, dl_manager):
        return {'train': self._generate_examples('a'), 'test': self._generate_examples()}

    def _generate_examples(self, subset='toytest2014'):
        for i in range(40):
            yield f'{subset}/0/{i}', {'en': f'line {i}', 'de': f'Zeile {i}'}


class ShuffledUnknownKeys(ShuffledToy):
    """The same, but with keys whose order nothing here can recover."""

    subsets = None

    def _generate_examples(self, subset='test'):
        for i in range(40):
            yield f'{subset}{i * 7919 % 40}', {'en': f'line {i}', 'de': f'Zeile {i}'}


@pytest.mark.slow
def test_tfds_shuffled_split_comes_back_in_file_order(tmp_path, offline):
    """A split TFDS stores in hashed order is read in the generator's (the files') order when
    its keys are known (WMT test sets), so line i of eval/*.txt is sentence i of the test set
    and --max_examples N takes the first N; otherwise the stored order is kept and said so."""
    config = _config(dataset='shuffled_toy', data_dir=str(tmp_path), vocab_size=60)
    builder = tfds.builder('shuffled_toy', data_dir=str(tmp_path))
    builder.download_and_prepare()
    stored = [ex['en'].decode() for ex in tfds.as_numpy(builder.as_dataset(split='test'))]
    official = [f'line {i}' for i in range(40)]
    assert sorted(stored) == sorted(official) and stored != official  # really shuffled
    assert data.load_text(config, 'test') == (official, [f'Zeile {i}' for i in range(40)])
    assert data.order_note(config, 'test') is None
    tokenizer = data.get_tokenizer(config, str(tmp_path / 'spm.model'))
    eval_set = data.make_eval_set(config, tokenizer, 'test', batch_size=8, max_examples=5)
    assert eval_set.references == [f'Zeile {i}' for i in range(5)]

    unknown = _config(dataset='shuffled_unknown_keys', data_dir=str(tmp_path))
    tfds.builder('shuffled_unknown_keys', data_dir=str(tmp_path)).download_and_prepare()
    sources_, targets = data.load_text(unknown, 'test')
    assert sources_ != official and [s.replace('line', 'Zeile') for s in sources_] == targets
    assert 'cannot be recovered' in data.order_note(unknown, 'test')


def test_folder_with_hostile_lines_trains(tmp_path):
    """Training input from files with invalid UTF-8, NUL, CRLF, blank and over-long lines:
    the vocabulary trains and packed batches come out (blank pairs and, by default, pairs
    over max_len are dropped by the packer)."""
    from tests.data.test_data_text import HOSTILE

    words = 'the a cat dog sees runs big small house tree'.split()
    lines = [' '.join(words[(i * k) % 10] for k in range(1, 2 + i % 6)) for i in range(60)]
    body = '\n'.join(lines).encode()
    (tmp_path / 'train.en').write_bytes(HOSTILE + b'\n' + b'dog ' * 300 + b'\n' + body)
    (tmp_path / 'train.de').write_bytes(HOSTILE + b'\nDOG\n' + body.upper() + b'\n')
    config = _config(dataset='folder', folder=str(tmp_path), vocab_size=60, max_len=16)
    tokenizer = data.get_tokenizer(config, str(tmp_path / 'work' / 'spm.model'))
    batch = next(data.make_train_iterator(config, tokenizer, batch_size=2, seed=0))
    assert batch['inputs'].shape == (2, 16) and (batch['inputs_segmentation'] > 0).any()
