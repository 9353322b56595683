"""The one check every config section runs (transformer/fields.py): the model's
TransformerConfig and the schema's sections reject a value outside a field's rule the same way,
in one line that names the key."""

import dataclasses

import pytest

from transformer import fields, schema
from transformer.model import TransformerConfig

SECTIONS = [TransformerConfig, *schema.SECTIONS.values()]
# Values tried against each rule: one of them fails it for every rule there is.
CANDIDATES = (0, -1, 1, 1.0, 0.0)


def _section(cls, **values):
    """``cls`` at its defaults but for ``values`` (the model needs a vocabulary)."""
    if cls is TransformerConfig:
        values = {'vocab_size': 8, **values}
    return cls(**values)


def _ruled_fields():
    for cls in SECTIONS:
        for f in dataclasses.fields(cls):
            if 'rule' in f.metadata:
                yield pytest.param(cls, f, id=f'{cls.SECTION}.{f.name}')


def test_every_section_runs_the_one_check():
    assert all(issubclass(cls, fields.Section) for cls in SECTIONS)
    assert TransformerConfig.SECTION == 'model'


@pytest.mark.parametrize(('cls', 'field'), list(_ruled_fields()))
def test_a_value_outside_the_rule_is_named_in_one_line(cls, field):
    ok, wanted = field.metadata['rule']
    if field.type == 'str':  # a choice among registered names (model/variants.py)
        bad = 'no_such_choice'
        assert not ok(bad)
    elif field.type == 'bool':  # both values registered (model/variants.py): the type says it
        assert ok(True) and ok(False)
        bad, wanted = -1.0, 'of type bool'
    else:
        kind = int if field.type in ('int', 'int | None') else float
        bad = next(kind(v) for v in CANDIDATES if not ok(kind(v)))
    with pytest.raises(fields.ConfigError) as info:
        _section(cls, **{field.name: bad})
    assert str(info.value) == f'{cls.SECTION}.{field.name}={bad!r} must be {wanted}.'


def test_the_model_rejects_what_the_sections_reject():
    """The same kinds of bad value, a model field and a schema field side by side."""
    for cls, name in ((TransformerConfig, 'dropout_rate'), (schema.OptSection, 'b2')):
        for bad, wanted in ((float('nan'), 'a finite number'), ('0.1', 'of type float')):
            with pytest.raises(fields.ConfigError) as info:
                _section(cls, **{name: bad})
            assert str(info.value) == f'{cls.SECTION}.{name}={bad!r} must be {wanted}.'
    with pytest.raises(fields.ConfigError, match=r'model.pre_layer_norm=1 must be of type bool'):
        _section(TransformerConfig, pre_layer_norm=1)


def test_an_unknown_key_is_named_with_the_nearest_known_one_in_every_section():
    """The model section (`config_from_dict`) and the schema's sections share the check."""
    from transformer import configs
    from transformer.model import config_from_dict

    with pytest.raises(fields.ConfigError) as info:
        config_from_dict({'d_modle': 8}, vocab_size=8)
    assert str(info.value) == 'unknown config key model.d_modle; did you mean model.d_model?'
    values = configs.load('tiny').to_dict()
    values['opt']['warmup_stesp'] = 5
    with pytest.raises(fields.ConfigError) as info:
        schema.parse(values)
    assert str(info.value) == 'unknown config key opt.warmup_stesp; did you mean opt.warmup_steps?'
    with pytest.raises(fields.ConfigError, match=r'^unknown config key model\.zzz$'):
        config_from_dict({'zzz': 1}, vocab_size=8)
