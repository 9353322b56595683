"""The typed config schema: every packaged config parses into typed sections; a config
written before a field existed is completed with the value its run used; each rule and
default is written once."""

import dataclasses
import json
import pathlib
import re

import ml_collections
import pytest

from transformer import configs, rundir, schema
from transformer.model import TransformerConfig

PACKAGE = pathlib.Path(__file__).parents[1] / 'transformer'


@pytest.mark.parametrize('name', configs.names())
def test_packaged_configs_parse_into_typed_sections(name):
    config = configs.load(name)
    experiment = schema.parse(config)
    assert isinstance(experiment.model, TransformerConfig)
    assert experiment.model.d_model == config.model.d_model
    assert experiment.train.num_steps == config.train.num_steps
    assert experiment.opt.schedule in schema.SCHEDULES
    assert experiment.eval.best_metric in schema.METRICS
    assert experiment.data.max_len == config.data.max_len
    with pytest.raises(dataclasses.FrozenInstanceError):
        experiment.train.num_steps = 1  # type: ignore[misc]


def _without(config: ml_collections.ConfigDict, *keys: str) -> ml_collections.ConfigDict:
    values = config.to_dict()
    for key in keys:
        section, name = key.split('.')
        del values[section][name]
    return ml_collections.ConfigDict(values)


def test_a_config_written_before_a_field_is_completed_with_the_value_its_run_used():
    old = _without(
        configs.load('tiny'),
        'eval.compound_split',
        'eval.lowercase_tokenized',
        'train.dropout_prng',
        'opt.cooldown_steps',
        'eval.best_metric',
    )
    values = old.to_dict()
    values['model']['max_len'] = 64  # a key earlier versions wrote
    completed = schema.complete(ml_collections.ConfigDict(values))
    assert completed.eval.compound_split is True  # as configs/base.py; was False in evaluate
    assert completed.eval.lowercase_tokenized is False
    assert completed.train.dropout_prng == 'threefry'
    assert completed.opt.cooldown_steps == 0
    assert completed.eval.best_metric == 'sacrebleu'
    assert 'max_len' not in completed.model
    schema.parse(completed)  # and it is a whole config


def test_read_config_completes_a_saved_config_json(tmp_path):
    values = _without(configs.load('tiny'), 'eval.compound_split').to_dict()
    values['model']['max_len'] = 64
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps(values))
    config = rundir.read_config(str(tmp_path))
    assert isinstance(config, schema.Experiment)  # typed, as every command reads a run
    assert config.eval.compound_split is True
    assert config.data.synthetic.num_train == values['data']['synthetic']['num_train']
    assert 'model.max_len' not in rundir.flat_config(config)


@pytest.mark.parametrize(
    'key, value, message',
    [
        ('train.num_steps', None, 'config key train.num_steps is missing.'),
        ('train.num_stpes', 5, 'unknown config key train.num_stpes; did you mean train.num_steps?'),
        ('eval.alpha', 'x', "eval.alpha='x' must be of type float."),
        ('train.fsdp', 1, 'train.fsdp=1 must be of type bool.'),
        ('train.process_id', -1, 'train.process_id=-1 must be >= 0.'),
        ('train.coordinator_address', 5, 'train.coordinator_address=5 must be of type str or'),
        ('model.d_model', 0, 'model.d_model=0 must be an integer >= 1.'),
        ('model.share_embeddings', 'both', "model.share_embeddings='both' must be one of 'all'"),
        ('model.dtype', 'float64', "model.dtype='float64' must be one of 'float32'"),
        ('data.long_examples', 'cut', "data.long_examples='cut' must be one of 'drop'"),
        ('data.max_len', 1, 'data.max_len=1 must be an integer >= 2.'),
    ],
)
def test_bad_values_are_named_in_one_line(key, value, message):
    values = configs.load('tiny').to_dict()
    section, name = key.split('.')
    if value is None:
        del values[section][name]
    else:
        values[section][name] = value
    with pytest.raises(schema.ConfigError) as info:
        schema.parse(values)
    assert message in str(info.value) and '\n' not in str(info.value)


def test_an_integer_is_a_float_but_a_bool_is_not_a_number():
    values = configs.load('tiny').to_dict()
    values['eval']['alpha'] = 1
    assert schema.parse(values).eval.alpha == 1
    values['eval']['alpha'] = True
    with pytest.raises(schema.ConfigError, match='eval.alpha=True must be of type float'):
        schema.parse(values)


def test_readers_carry_no_defaults_of_their_own():
    """A default for a config key is the schema's: no ``<section>.get('key', default)`` in
    the package (rundir.read_config completes what an old config.json lacks)."""
    pattern = re.compile(r"\.(model|data|opt|train|eval|tc|ev)\.get\('|\b(tc|ev|opt)\.get\('")
    found = [
        f'{path.relative_to(PACKAGE)}:{number}'
        for path in PACKAGE.rglob('*.py')
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_each_choice_list_is_written_once():
    """The tuples the modules check choices against are the schema's Literals (the model's
    and the data's own choices stay with them: the schema imports those)."""
    from transformer.training import optim, parallel, steps

    assert optim.SCHEDULES is schema.SCHEDULES
    assert steps.DROPOUT_PRNGS is schema.DROPOUT_PRNGS
    assert parallel.MODES is schema.PARALLELISMS
