"""What train and prepare check before they write: a --workdir that holds what no run writes,
train.init_from naming the workdir itself, a fine-tuning recipe without a start, a data.mix
tag the vocabulary lacks and a vocabulary other than the run's each stop in one line, and
the directory is left as it was (every file's hash equal), or not made at all."""

import json
import os

import pytest

from tests.tiny_run import SMALL, file_hashes, run_dir_with, tiny_run_config
from transformer import configs, data, lock, rundir, schema
from transformer.training import TrainingError, prepare_data, train_and_evaluate
from transformer.training.workdir_checks import check_workdir


def _commands(config, workdir):
    """Train and prepare on ``workdir``, each as a callable."""
    return {
        'train': lambda: train_and_evaluate(config, str(workdir)),
        'prepare': lambda: prepare_data(config, str(workdir)),
    }


def _refused(call, error, match: str) -> str:
    with pytest.raises(error) as info:
        call()
    line = str(info.value)
    assert match in line and '\n' not in line, line
    return line


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    """A folder corpus (train, validation, test) of 40 short pairs."""
    folder = tmp_path_factory.mktemp('corpus')
    for split in ('train', 'validation', 'test'):
        (folder / f'{split}.en').write_text(''.join(f'a small house {i}\n' for i in range(40)))
        (folder / f'{split}.de').write_text(''.join(f'ein kleines Haus {i}\n' for i in range(40)))
    return folder


@pytest.fixture(scope='module')
def vocabulary(tmp_path_factory):
    """A SentencePiece vocabulary of the synthetic data, without any tag."""
    config = tiny_run_config(1).data
    path = tmp_path_factory.mktemp('vocab') / 'spm.model'
    data.get_tokenizer(config, str(path))
    return str(path)


def test_a_directory_is_a_runs_only_if_it_holds_what_a_run_writes(tmp_path):
    check_workdir(str(tmp_path / 'missing'))
    check_workdir(str(tmp_path))  # empty
    (tmp_path / lock.LOCK_FILE).write_text('')  # a run that stopped during set-up
    (tmp_path / '.nfs0001').write_text('')  # a network file system's, not the user's
    for name in (rundir.VOCAB_DIR, rundir.DATA_CACHE, rundir.CHECKPOINTS, rundir.EVAL_DIR):
        (tmp_path / name).mkdir()
    check_workdir(str(tmp_path))

    (tmp_path / 'tokens').mkdir()
    line = _refused(lambda: check_workdir(str(tmp_path)), TrainingError, '(tokens)')
    assert line == (
        f'{tmp_path} holds files that no run writes (tokens): train in a new or empty '
        '--workdir (a model to start from goes in --config.train.init_from).'
    )
    config = tiny_run_config(1)
    config.data.cache_dir = str(tmp_path / 'tokens' / 'cache')  # the run's own, kept inside
    check_workdir(str(tmp_path), schema.parse(config))
    (tmp_path / 'train.log').write_text('step 1')  # beside a run's config.json: its user's
    (tmp_path / rundir.CONFIG_FILE).write_text('{"model": {}, "data": {}}')
    check_workdir(str(tmp_path))

    (tmp_path / 'model.safetensors').write_bytes(b'\0')
    line = _refused(lambda: check_workdir(str(tmp_path)), TrainingError, 'model.safetensors')
    assert line == (
        f"{tmp_path} holds a pretrained model's files (model.safetensors), not a run: "
        f'fine-tune it with --config.train.init_from={tmp_path} and a new --workdir.'
    )
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps({'model_type': 't5'}))
    line = _refused(lambda: check_workdir(str(tmp_path)), TrainingError, "(model_type 't5')")
    assert line.startswith(f"{tmp_path} holds a Hugging Face model (model_type 't5'), not a run")


@pytest.mark.parametrize('command', ['train', 'prepare'])
def test_a_directory_of_other_files_is_left_as_it_was(command, tmp_path):
    workdir = tmp_path / 'mine'
    workdir.mkdir()
    (workdir / 'thesis.tex').write_text('\\section{Results}')
    (workdir / 'figures').mkdir()
    before = file_hashes(workdir)
    _refused(_commands(tiny_run_config(1), workdir)[command], TrainingError, 'thesis.tex')
    assert file_hashes(workdir) == before


@pytest.mark.parametrize('command', ['train', 'prepare'])
@pytest.mark.parametrize('step', ['', '@1'])
def test_init_from_naming_the_workdir_itself_is_refused_before_any_write(command, step, tmp_path):
    workdir, config = run_dir_with(tmp_path)
    config.train.init_from = f'{workdir}{step}'
    before = file_hashes(workdir)
    line = _refused(_commands(config, workdir)[command], TrainingError, 'itself')
    assert line == (
        f'train.init_from={workdir}{step} is the --workdir itself: a run writes its own files '
        'into its work directory; fine-tune into a new --workdir.'
    )
    assert file_hashes(workdir) == before


@pytest.mark.parametrize('command', ['train', 'prepare'])
def test_the_finetune_recipe_without_init_from_stops_before_writing(command, corpus, tmp_path):
    config = configs.load('multi30k:finetune')
    assert config.train.init_from_required and config.train.init_from is None
    # Seconds, on the corpus, should it train: the check comes before any of it.
    shrunk = {**SMALL, 'train.num_steps': 1, 'opt.cooldown_steps': 0, 'data.test_split': 'test'}
    config.update_from_flattened_dict(shrunk)
    config.data.update(dataset='folder', folder=str(corpus))
    workdir = tmp_path / 'run'
    _refused(
        _commands(config, workdir)[command],
        TrainingError,
        'This config fine-tunes a pretrained model (train.init_from_required) and names none: '
        'give --config.train.init_from=PATH',
    )
    assert not workdir.exists()


@pytest.mark.parametrize('command', ['train', 'prepare'])
@pytest.mark.parametrize('existed', [False, True])
def test_a_mix_tag_the_vocabulary_lacks_stops_before_writing(
    command, existed, corpus, vocabulary, tmp_path
):
    """A given vocabulary (data.vocab_path) without the tag: nothing written, not even the
    lock file in a directory that was there before."""
    config = tiny_run_config(1)
    config.data.update(vocab_path=vocabulary, mix=f'syn=synthetic,bt={corpus}:<bt>')
    workdir = tmp_path / 'run'
    if existed:
        workdir.mkdir()
    _refused(
        _commands(config, workdir)[command],
        data.DataError,
        "the tag of data.mix entry 'bt'='<bt>' is not a token of the vocabulary.",
    )
    assert (sorted(os.listdir(workdir)) == []) if existed else not workdir.exists()


def test_prepare_and_train_refuse_another_vocabulary_size_on_a_run(tmp_path):
    workdir = tmp_path / 'run'
    config = tiny_run_config(1)
    prepare_data(config, str(workdir))
    assert rundir.read_config(str(workdir)).data.vocab_size == SMALL['data.vocab_size']
    before = file_hashes(workdir)
    config.data.vocab_size = 8000
    for command in _commands(config, workdir).values():
        line = _refused(command, TrainingError, 'data.vocab_size=300, not 8000')
        assert line == (
            f'{workdir} holds a vocabulary made with data.vocab_size=300, not 8000: a run keeps '
            "its vocabulary. Give the run's own setting, or use a new --workdir."
        )
        assert file_hashes(workdir) == before
    config.data.vocab_size = SMALL['data.vocab_size']
    prepare_data(config, str(workdir))  # its own settings: found again, nothing rebuilt
    assert file_hashes(workdir) == before
