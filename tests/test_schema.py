"""The typed config schema: every packaged config parses into typed sections; a config
written before a field existed is completed with the value its run used; each rule and
default is written once."""

import ast
import dataclasses
import json
import pathlib
import re
from typing import Any

import jax
import ml_collections
import pytest

from transformer import configs, run_changes, rundir, schema
from transformer.model import VOCABULARY_FIELDS, TransformerConfig

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
    completed = schema.complete(values)
    assert completed['eval']['compound_split'] is True  # as configs/base.py; was False before
    assert completed['eval']['lowercase_tokenized'] is False
    assert completed['train']['dropout_prng'] == 'threefry'
    assert completed['opt']['cooldown_steps'] == 0
    assert completed['eval']['best_metric'] == 'sacrebleu'
    assert 'max_len' not in completed['model']
    assert 'max_len' in values['model']  # the config given is left as it is
    schema.parse(completed)  # and it is a whole config


def test_read_config_completes_a_saved_config_json(tmp_path):
    values = _without(configs.load('tiny'), 'eval.compound_split').to_dict()
    values['model']['max_len'] = 64
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps(values))
    config = rundir.read_config(str(tmp_path))
    assert isinstance(config, schema.Experiment)  # typed, as every command reads a run
    assert config.eval.compound_split is True
    assert config.data.synthetic.num_train == values['data']['synthetic']['num_train']
    assert 'model.max_len' not in run_changes.flat_config(config)


def test_a_saved_config_with_a_removed_value_loads_or_says_what_became_of_it(tmp_path, caplog):
    """config.json as 2698791-9f56641 wrote it: train.loss_pass 'float32' (the one pass left)
    is dropped silently; model.attention_impl 'cudnn_packed' (also through a resume's change,
    config_history.jsonl) loads as 'auto' with one warning line; 'accumulate' stops in one line
    naming the file and what became of it."""
    values = configs.load('tiny').to_dict()
    values['train']['loss_pass'] = 'float32'
    values['model']['attention_impl'] = 'cudnn_packed'
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps(values))
    with caplog.at_level('WARNING'):
        config = rundir.read_config(str(tmp_path))
    assert config.model.attention_impl == 'auto'
    assert 'train.loss_pass' not in run_changes.flat_config(config)
    warnings = [r.getMessage() for r in caplog.records if 'cudnn_packed' in r.getMessage()]
    assert warnings == [
        "model.attention_impl='cudnn_packed' was removed (docs/experiments.md, \"Removed "
        "options\"): its gradients were wrong on an H200; it loads as 'auto'."
    ]
    values['model']['attention_impl'] = 'einsum'
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps(values))
    change = {'step': 2, 'key': 'model.attention_impl', 'old': 'einsum', 'new': 'cudnn_packed'}
    (tmp_path / rundir.HISTORY_FILE).write_text(json.dumps(change) + '\n')
    assert rundir.read_config(str(tmp_path)).model.attention_impl == 'auto'
    values['train']['loss_pass'] = 'accumulate'
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps(values))
    with pytest.raises(rundir.WorkdirError) as info:
        rundir.read_config(str(tmp_path))
    assert str(info.value) == (
        f"{tmp_path / rundir.CONFIG_FILE}: train.loss_pass='accumulate' was removed "
        '(docs/experiments.md, "Removed options"): no faster than the float32 loss on an H200; '
        'delete the key to use that one.'
    )
    with pytest.raises(schema.ConfigError, match="loss_pass='accumulate' was removed"):
        schema.complete(values)


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


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def _assigned(path: pathlib.Path) -> dict[str, Any]:
    """Dotted config key -> literal value of each ``config.section.key = literal`` (or
    ``alias.key = literal``, ``alias = config.section``) in a config file."""
    tree = ast.parse(path.read_text())
    aliases = {'config': []}
    assigns = [node for node in ast.walk(tree) if isinstance(node, ast.Assign)]
    for node in sorted(assigns, key=lambda n: n.lineno):
        chains = [_dotted(t) for t in node.targets]
        source = _dotted(node.value)
        if source and source[0] in aliases:  # model = config.model
            for chain in chains:
                if chain and len(chain) == 1:
                    aliases[chain[0]] = aliases[source[0]] + source[1:]
        rooted = [c for c in chains if c and len(c) > 1 and c[0] in aliases]
        for chain in rooted:  # config.model = model = ConfigDict()
            for other in chains:
                if other and len(other) == 1:
                    aliases[other[0]] = aliases[chain[0]] + chain[1:]
    found = {}
    for node in assigns:
        for chain in map(_dotted, node.targets):
            if chain and len(chain) > 1 and chain[0] in aliases:
                try:
                    found['.'.join(aliases[chain[0]] + chain[1:])] = ast.literal_eval(node.value)
                except ValueError:
                    pass  # not a literal: a section, a placeholder
    return found


def _field_defaults() -> dict[str, Any]:
    """Every field's default, from the dataclasses themselves (the schema's sections and the
    model's TransformerConfig)."""
    found = {
        f'model.{f.name}': f.default
        for f in dataclasses.fields(TransformerConfig)
        if f.default is not dataclasses.MISSING and f.name not in VOCABULARY_FIELDS
    }
    for name, cls in schema.SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                found[f'{name}.{f.name}'] = f.default
    return found


def test_configs_base_writes_only_the_choices_that_differ_from_the_schema():
    """Each default is written once, on its field: configs/base.py sets no key to the value
    the schema (or TransformerConfig, the model section) already gives it, and the configs
    built on base set no key to base's value."""
    defaults = _field_defaults()
    written = _assigned(PACKAGE / 'configs' / 'base.py')
    assert written, 'configs/base.py sets no field'  # the walk finds its assignments
    restated = {k: v for k, v in written.items() if k in defaults and defaults[k] == v}
    assert not restated, f'configs/base.py restates the schema defaults {restated}'
    base = run_changes.flat_config(configs.load('base'))
    for name in ('tiny', 'big', 'multi30k'):
        written = _assigned(PACKAGE / 'configs' / f'{name}.py')
        assert written, name
        restated = {k: v for k, v in written.items() if k in base and base[k] == v}
        assert not restated, f'configs/{name}.py restates configs/base.py: {restated}'


def test_the_default_config_is_the_fields_defaults_and_nothing_else():
    """`schema.default_config` is derived from the fields (model: TransformerConfig's), the
    data sources adding only keys the data section does not have; the data package keeps no
    defaults of its own."""
    from transformer import data
    from transformer.data import sources

    flat = run_changes.flat_config(schema.default_config())
    defaults = _field_defaults()
    defaults['model.dtype'] = defaults['model.param_dtype'] = 'float32'
    assert {k: flat[k] for k in defaults} == defaults
    data_fields = {f.name for f in dataclasses.fields(schema.DataSection)}
    source_keys = {k.split('.')[1] for k in flat if k.startswith('data.')} - data_fields
    assert source_keys == {'synthetic', 'data_dir', 'manual_dir', 'folder'}
    own = {key.split('.')[0] for key in sources.own_keys()}
    assert not own & data_fields  # no source writes a default of the section's keys
    assert not hasattr(data, 'default_config')


def test_attention_impl_has_one_default_auto_which_resolves_per_platform():
    from transformer.backends import platform

    assert TransformerConfig(vocab_size=8).attention_impl == 'auto'
    for name in configs.names():
        assert schema.parse(configs.load(name)).model.attention_impl == 'auto', name
    assert platform.attention_impl('auto') == (
        'fused' if jax.default_backend() == 'gpu' else 'einsum'
    )


def test_every_field_has_a_one_line_description():
    flat = run_changes.flat_config(schema.default_config())
    descriptions = schema.descriptions()
    assert set(descriptions) == set(flat)
    for key, text in descriptions.items():
        assert text.strip() and '\n' not in text and len(text) <= 100, key


def test_only_optional_fields_are_filled_in_for_old_configs():
    """A field every config has given is required (a missing one is an error, not a silent
    default); the optional ones, added later, are those `complete` fills in."""
    values = configs.load('tiny').to_dict()
    required = [
        f'{name}.{f.name}'
        for name, cls in schema.SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.name != 'sources' and not f.metadata['optional']
    ]
    assert 'train.num_steps' in required and 'train.seed' not in required
    for key in required:
        section, name = key.split('.')
        broken = json.loads(json.dumps(values))
        del broken[section][name]
        completed = schema.complete(ml_collections.ConfigDict(broken))
        with pytest.raises(schema.ConfigError, match=f'config key {key} is missing'):
            schema.parse(completed)


def test_init_timeout_has_the_bound_jax_distributed_takes():
    most, why = schema.MAX_INIT_TIMEOUT
    values = configs.load('tiny').to_dict()
    values['train']['init_timeout_s'] = most
    assert schema.parse(values).train.init_timeout_s == most
    values['train']['init_timeout_s'] = most + 1
    with pytest.raises(schema.ConfigError) as info:
        schema.parse(values)
    assert str(info.value) == f'train.init_timeout_s={most + 1} must be <= {most} ({why}).'


def test_jax_distributed_refuses_a_timeout_over_the_bound():
    """The bound is where jax's client stops taking the timeout (a client is made, not
    connected)."""
    _jax = pytest.importorskip('jax._src.lib')._jax
    make = getattr(_jax, 'get_distributed_runtime_client', None)
    if make is None:
        pytest.skip('this jax has no get_distributed_runtime_client')
    most = schema.MAX_INIT_TIMEOUT[0]
    assert make('localhost:1', 0, init_timeout=most) is not None
    with pytest.raises(TypeError):
        make('localhost:1', 0, init_timeout=most + 1)
