"""Paths in a run's config.json: stored absolute, resolved against the directory the command
was given in, so that evaluate reads the run's data from anywhere; a stored path that no
longer exists is named in one line, with the file that holds it."""

import json
import os

import pytest

from tests.tiny_run import tiny_run_config
from transformer import evaluate, run_changes, rundir, schema
from transformer.commands import decoding_run
from transformer.training import prepare_data

SPLITS = {'train': 'train', 'validation': 'val', 'test2016': 'test2016'}  # Multi30k's names


def _multi30k_files(directory, pairs: int = 30):
    directory.mkdir(parents=True)
    for stem in SPLITS.values():
        (directory / f'{stem}.en').write_text(''.join(f'a dog runs {i}\n' for i in range(pairs)))
        (directory / f'{stem}.de').write_text(
            ''.join(f'ein Hund rennt {i}\n' for i in range(pairs))
        )


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """(run directory, data directory): a run prepared from ``tmp_path/a`` with
    ``--config.data.manual_dir=data/multi30k``, as typed there."""
    monkeypatch.chdir(tmp_path)
    _multi30k_files(tmp_path / 'a' / 'data' / 'multi30k')
    monkeypatch.chdir(tmp_path / 'a')
    config = tiny_run_config(1)
    config.data.update(dataset='multi30k', test_split='test2016', manual_dir='data/multi30k')
    prepare_data(config, 'run')
    return tmp_path / 'a' / 'run', tmp_path / 'a' / 'data' / 'multi30k'


def test_a_relative_manual_dir_is_stored_absolute_and_read_from_elsewhere(
    prepared, tmp_path, monkeypatch
):
    run, data_dir = prepared
    stored = json.loads((run / rundir.CONFIG_FILE).read_text())
    assert stored['data']['manual_dir'] == str(data_dir)
    (tmp_path / 'b').mkdir()
    monkeypatch.chdir(tmp_path / 'b')  # evaluate, run from another directory
    config = rundir.read_config(str(run))
    decoding_run.check_split(str(run), config, 'test2016')
    tokenizer = rundir.load_tokenizer(config, str(run))
    eval_set = evaluate.make_eval_set(config, tokenizer, str(run), 'test2016')
    assert eval_set.references == [f'ein Hund rennt {i}' for i in range(30)]


def test_a_stored_path_that_moved_is_named_in_one_line(prepared):
    run, data_dir = prepared
    os.rename(data_dir, data_dir.parent / 'moved')
    config = rundir.read_config(str(run))
    with pytest.raises(rundir.WorkdirError) as info:
        decoding_run.check_split(str(run), config, 'test2016')
    assert str(info.value) == (
        f'{run / rundir.CONFIG_FILE} holds data.manual_dir={data_dir}, which does not exist '
        '(moved?): set data.manual_dir there to where the files are now, as an absolute path.'
    )


def test_every_path_setting_is_made_absolute_and_dataset_names_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'bt').mkdir()
    config = tiny_run_config(1)
    config.data.update(vocab_path='vocab/spm.model', cache_dir='~/cache', data_dir='gs://b/tfds')
    config.data.mix = 'bt=bt:2:<bt>,own=./own:<bt2>,wmt=wmt14_translate/de-en:0.5'
    config.train.init_from = 'runs/base@400'
    experiment = schema.absolute_paths(schema.parse(config))
    assert experiment.data.vocab_path == str(tmp_path / 'vocab' / 'spm.model')
    assert experiment.data.cache_dir == os.path.expanduser('~/cache')
    assert experiment.data.data_dir == 'gs://b/tfds'  # a URL as it is
    assert experiment.data.mix == (
        f'bt={tmp_path}/bt:2:<bt>,own={tmp_path}/own:<bt2>,wmt=wmt14_translate/de-en:0.5'
    )
    assert experiment.train.init_from == f'{tmp_path}/runs/base@400'
    assert schema.absolute_paths(experiment) is experiment  # absolute already


def test_a_run_that_stored_a_relative_path_resumes_with_it_absolute(tmp_path, monkeypatch):
    """A config.json written before paths were stored absolute: the same file, named from
    the directory the run is resumed in, is no change of its data; it is recorded."""
    monkeypatch.chdir(tmp_path)
    config = tiny_run_config(1)
    config.data.vocab_path = 'given/spm.model'
    workdir = tmp_path / 'run'
    workdir.mkdir()
    values = schema.to_dict(schema.parse(config))  # as typed, as config.json held it
    (workdir / rundir.CONFIG_FILE).write_text(json.dumps(values))
    (tmp_path / 'given').mkdir()
    (tmp_path / 'given' / 'spm.model').write_bytes(b'')
    changes = run_changes.resume_changes(str(workdir), schema.absolute_paths(schema.parse(config)))
    assert changes == [
        ('data.vocab_path', 'given/spm.model', str(tmp_path / 'given' / 'spm.model'))
    ]
    config.data.vocab_path = 'other/spm.model'
    (tmp_path / 'other').mkdir()
    (tmp_path / 'other' / 'spm.model').write_bytes(b'')
    with pytest.raises(rundir.WorkdirError, match=r"data.vocab_path='given/spm.model', not"):
        run_changes.resume_changes(str(workdir), schema.absolute_paths(schema.parse(config)))
