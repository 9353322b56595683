"""A vocabulary's special ids: one value (`SpecialIds`), recorded in config.json's data section,
read back from there, checked against the vocabulary a run loads, and kept by a resume."""

import json

import pytest

from tests.tiny_run import run_dir_with, tiny_run_config
from transformer import data, run_changes, rundir, schema
from transformer.data import tokenizer as tokenizer_lib
from transformer.tokens import JOINT, SpecialIds

# NLLB-200's layout: <s> 0, <pad> 1, </s> 2, <unk> 3, the decoder starting from </s>.
NLLB_LIKE = SpecialIds(pad=1, eos=2, unk=3, decoder_start=2, never_emit=(1, 0))


def _with_ids(config, special: SpecialIds):
    config.data.update(data.special_fields(special))
    return config


def test_the_joint_ids_are_the_default_and_a_run_records_them():
    experiment = schema.parse(tiny_run_config(1))
    assert experiment.data.special == experiment.model.special == JOINT
    assert (JOINT.pad, JOINT.eos, JOINT.unk, JOINT.decoder_start) == (0, 1, 2, 0)
    recorded = schema.to_dict(experiment)['data']
    assert {k: recorded[k] for k in data.SPECIAL_FIELDS} == {
        'pad_id': 0,
        'eos_id': 1,
        'unk_id': 2,
        'decoder_start_id': 0,
        'never_emit': '0',
    }
    assert 'special' not in schema.to_dict(experiment)['model']  # the data section holds them


def test_other_ids_go_from_the_config_to_the_model_and_back():
    experiment = schema.parse(_with_ids(tiny_run_config(1), NLLB_LIKE))
    assert experiment.data.special == experiment.model.special == NLLB_LIKE
    assert NLLB_LIKE.never_emit == (0, 1)  # sorted, pad included
    again = schema.parse(schema.to_dict(experiment))
    assert again.model.special == NLLB_LIKE


def test_a_config_json_written_before_the_ids_loads_with_the_joint_ones(tmp_path):
    workdir, config = run_dir_with(tmp_path)
    values = json.loads((workdir / rundir.CONFIG_FILE).read_text())
    for key in data.SPECIAL_FIELDS:
        del values['data'][key]
    (workdir / rundir.CONFIG_FILE).write_text(json.dumps(values))
    assert rundir.read_config(str(workdir)).model.special == JOINT


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'pad_id': 1}, r'pad_id=1, eos_id=1 and unk_id=2 must be three different ids'),
        ({'never_emit': '0,1'}, r'never_emit holds eos_id=1: a search must end'),
        ({'never_emit': '0;5'}, r"data.never_emit='0;5' must be comma-separated ids"),
        ({'decoder_start_id': 5000}, r'data.vocab_size=\d+ holds no id 5000'),
        ({'unk_id': -1}, r'data.unk_id=-1 must be >= 0'),
    ],
)
def test_ids_that_cannot_work_are_refused_in_one_line(overrides, message):
    config = tiny_run_config(1)
    config.data.update(overrides)
    with pytest.raises(schema.ConfigError, match=message) as info:
        schema.parse(config)
    assert '\n' not in str(info.value)


def test_a_resume_that_changes_the_ids_is_refused(tmp_path):
    workdir, config = run_dir_with(tmp_path)
    assert run_changes.resume_changes(str(workdir), schema.parse(config)) == []
    config = _with_ids(config, SpecialIds(pad=0, eos=1, unk=2, decoder_start=1, never_emit=()))
    with pytest.raises(rundir.WorkdirError, match=r'data.decoder_start_id=0, not 1'):
        run_changes.resume_changes(str(workdir), schema.parse(config))


def test_a_vocabulary_whose_ids_are_not_the_runs_is_refused_where_it_loads(tmp_path):
    tokenizer = tokenizer_lib.train_tokenizer(
        ['ze bland robop', 'robop ze', 'bland'] * 20, str(tmp_path / 'spm.model'), vocab_size=40
    )
    assert isinstance(tokenizer, data.Vocabulary) and tokenizer.special == JOINT
    config = schema.parse(
        _with_ids(tiny_run_config(1), SpecialIds(3, 1, 2, decoder_start=3, never_emit=()))
    )
    workdir = tmp_path / 'run'
    (workdir / 'vocab').mkdir(parents=True)
    tokenizer.copy_to(workdir / 'vocab')
    assert (workdir / 'vocab' / 'spm.model').read_bytes() == (tmp_path / 'spm.model').read_bytes()
    with pytest.raises(
        rundir.WorkdirError, match=r'has the special ids pad_id=0 .* records pad_id=3'
    ):
        rundir.load_tokenizer(config, str(workdir))
    loaded = rundir.load_tokenizer(schema.parse(tiny_run_config(1)), str(workdir))
    assert loaded.fingerprint == tokenizer.fingerprint
