"""The registry of pretrained families (transformer/interop/families.py): a directory no family
reads, a name no family has, and the family a run exports as, each decided in one place."""

import json

import pytest

from tests.tiny_run import file_hashes, run_dir_with
from transformer import convert, export, interop, rundir

FAMILIES = (
    "marian (model_type 'marian'), m2m100 (model_type 'm2m_100'), mbart (model_type 'mbart'), "
    "t5 (model_type 't5')"
)
KNOWN = f'known families: {FAMILIES}.'


def _model_dir(tmp_path, config=None):
    directory = tmp_path / 'model'
    directory.mkdir()
    (directory / 'vocab.json').write_text('{}')  # a file of a model, which stays as it was
    if config is not None:
        (directory / 'config.json').write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    'config, says',
    [
        ({'model_type': 'bert'}, "config.json has model_type='bert'"),
        (None, 'no config.json'),
        ({'d_model': 8}, 'config.json names no model_type'),
    ],
)
def test_a_directory_no_family_reads_stops_in_one_line_naming_the_families(tmp_path, config, says):
    directory = _model_dir(tmp_path, config)
    line = f'{directory} is not a pretrained model directory this project reads ({says}); ' + KNOWN
    assert interop.recognised(str(directory)) is None
    with pytest.raises(interop.PretrainedError) as info:
        interop.family_of(str(directory))
    assert str(info.value) == line


@pytest.mark.parametrize('config', [{'model_type': 'bert'}, None])
def test_convert_writes_nothing_for_a_directory_no_family_reads(tmp_path, config):
    directory = _model_dir(tmp_path, config)
    before = file_hashes(tmp_path)
    out = tmp_path / 'run'
    with pytest.raises(SystemExit) as info:
        convert.cli(['convert', f'--from_hf={directory}', f'--workdir={out}'])
    message = info.value.code
    assert message.startswith(f'error: {directory} is not a pretrained model directory')
    assert message.endswith(KNOWN) and '\n' not in message
    assert file_hashes(tmp_path) == before  # no run, no staging directory


def test_the_marian_family_recognises_its_directories_only(tmp_path):
    directory = _model_dir(tmp_path, {'model_type': 'marian'})
    assert interop.family_of(str(directory)) is interop.family_named('marian')
    (directory / 'checkpoints').mkdir()  # a run directory beside it is not a MarianMT's
    assert interop.recognised(str(directory)) is None
    with pytest.raises(interop.PretrainedError, match='beside checkpoints'):
        interop.family_of(str(directory))


def test_a_name_no_family_has_is_refused():
    assert [f.name for f in interop.FAMILIES] == ['marian', 'm2m100', 'mbart', 't5']
    with pytest.raises(interop.PretrainedError) as info:
        interop.family_named('nllb')
    assert str(info.value) == f"'nllb' is not a pretrained family this project knows: {FAMILIES}."


def test_the_family_a_run_exports_as(tmp_path):
    """A converted run's recorded family, else its vocabulary's, else MarianMT's for a run
    trained here; a run converted before the family was recorded is a MarianMT's."""
    marian = interop.family_named('marian')
    assert interop.export_family(None, None) is marian
    assert interop.export_family('marian', None) is marian
    assert interop.vocabulary_family(object()) is None
    workdir, _ = run_dir_with(tmp_path)
    assert rundir.converted_family(str(workdir)) is None
    converted = workdir / rundir.CONVERTED_FILE
    converted.write_text(json.dumps({'from_hf': '/somewhere'}))
    assert rundir.converted_family(str(workdir)) == 'marian'
    converted.write_text(json.dumps({'from_hf': '/somewhere', 'family': 'nllb'}))
    assert rundir.converted_family(str(workdir)) == 'nllb'
    with pytest.raises(export.ExportError) as info:  # before the run is read or written
        export.export(str(workdir), str(tmp_path / 'out'))
    assert str(info.value).startswith("'nllb' is not a pretrained family this project knows")
    assert not (tmp_path / 'out').exists()
