"""Multi30k on a machine without the `tfds` extra: the raw files are the only way in, and the
error says so."""

import pytest

from transformer import data, schema
from transformer.data import multi30k, tfds_translate


@pytest.mark.parametrize('exists', [False, True])
def test_a_manual_dir_without_the_files_names_them_and_the_extra(tmp_path, monkeypatch, exists):
    def not_installed():
        raise data.DataError('Reading a TFDS dataset needs tensorflow-datasets: pip install ...')

    monkeypatch.setattr(tfds_translate, 'import_tfds', not_installed)
    manual = tmp_path / 'manual'
    if exists:
        manual.mkdir()
        (manual / 'train.en').write_text('a\n')
    config = schema.default_config().data
    config.update(dataset='multi30k', manual_dir=str(manual))
    with pytest.raises(data.DataError) as error:
        data.load_text(config, 'train')
    message = str(error.value)
    assert '\n' not in message and f'data.manual_dir={manual} lacks' in message
    assert all(name in message for name in multi30k.expected_files())
    assert 'tensorflow-datasets' in message
