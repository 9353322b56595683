"""transformer/model/settings.py: a numeric model setting is its declaration. A toy setting
(learned memory slots each attention would read: a [M, D] weight) declared here, with its
config field's one line, is seen by the parameter count, the FLOPs, the memory bound, --help,
the resume refusal and the PyTorch peer's refusal; the exports, which do not declare it, write
it at its default only (transformer/formats.py); and MarianMT's declaration refuses the values
of model.head_dim and model.num_kv_heads it cannot hold."""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.tiny_run import run_dir_with, tiny_run_config
from transformer import fields, run_changes, rundir, schema
from transformer.commands import export
from transformer.model import TransformerConfig, flops, settings, variants
from transformer.model import config as model_config
from transformer.schema import convert
from transformer.training import footprint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import torch_peer  # noqa: E402

SLOTS = 'num_memory_slots'
TOY = settings.Setting(
    SLOTS,
    0,
    'M, learned memory slots each attention reads',
    fields.NON_NEGATIVE,
    lambda cfg: {'attention': {'memory/kernel': (cfg.num_memory_slots, cfg.d_model)}},
    unbuilt=lambda cfg: 'it has no memory slots' if cfg.num_memory_slots else None,
)


@pytest.fixture
def toy(monkeypatch):
    """The toy declared, and TransformerConfig with its one line
    ``num_memory_slots: int = settings.config_field('num_memory_slots')``."""
    settings.declare(TOY)
    field = (SLOTS, int, settings.config_field(SLOTS))
    config_class = dataclasses.make_dataclass(
        'TransformerConfig', [field], bases=(TransformerConfig,), frozen=True
    )
    for module in (model_config, convert):
        monkeypatch.setattr(module, 'TransformerConfig', config_class)
    yield config_class
    settings.undeclare(SLOTS)


def _experiment(**model) -> schema.Experiment:
    config = tiny_run_config(1)
    config.model.update(model)
    return schema.parse(config)


def test_the_count_flops_and_memory_bound_read_the_declared_shapes(toy):
    plain, slots = (
        toy(vocab_size=40, d_model=16, num_heads=2, d_ff=24, **{SLOTS: m}) for m in (0, 3)
    )
    attentions = plain.num_encoder_layers + 2 * plain.num_decoder_layers
    assert variants.param_count(slots) - variants.param_count(plain) == attentions * 3 * 16
    assert variants.param_shapes(slots)['decoder_layer_0/cross_attention/memory/kernel'] == (3, 16)
    b, s, t = 2, 5, 3  # one product per token on the queries' side of each attention
    per_token = 2 * 3 * 16
    queries = b * (plain.num_encoder_layers * s + 2 * plain.num_decoder_layers * t)
    assert flops.forward_flops(slots, b, s, t) - flops.forward_flops(plain, b, s, t) == (
        queries * per_token
    )
    small, more = _experiment(), _experiment(**{SLOTS: 3})
    attentions = small.model.num_encoder_layers + 2 * small.model.num_decoder_layers
    added = attentions * 3 * small.model.d_model
    assert footprint.layer_params(more) - footprint.layer_params(small) == added


def test_help_shows_the_declared_description(toy, capsys):
    from transformer.commands import train

    with pytest.raises(SystemExit):
        train.cli(['train', '--config=tiny', '--help'])
    lines = capsys.readouterr().out.splitlines()
    line = next(x for x in lines if f'model.{SLOTS} =' in x)
    assert line.endswith('M, learned memory slots each attention reads')
    kv = next(x for x in lines if 'model.num_kv_heads =' in x)
    assert kv.endswith('K, key/value heads, a divisor of N (grouped-query attention); None = N')


@pytest.mark.parametrize(
    'key, old, new', [(SLOTS, 0, 2), ('num_kv_heads', None, 2), ('num_kv_heads', 2, 1)]
)
def test_a_resume_that_changes_a_setting_is_refused(toy, tmp_path, key, old, new):
    workdir, config = run_dir_with(tmp_path, **{key: old})
    config.model[key] = new
    with pytest.raises(rundir.WorkdirError, match=f'model.{key}={old!r}, not {new!r}'):
        run_changes.resume_changes(str(workdir), schema.parse(config))


@pytest.mark.parametrize(
    'key, value, reasons',
    [
        (
            SLOTS,
            2,
            {
                'hf': 'MarianMT writes num_memory_slots=0 only.',
                'ctranslate2': 'CTranslate2 writes num_memory_slots=0 only.',
            },
        ),
        (
            'num_kv_heads',
            2,
            {
                'hf': 'MarianMT has one key/value head per query head; only num_kv_heads=None '
                '(or num_heads) exports; --format=ctranslate2 writes num_kv_heads=2.'
            },
        ),
        (
            'head_dim',
            16,
            {
                'hf': 'MarianMT fixes head_dim = d_model / num_heads = 8; only head_dim=None (or '
                'equal to that) exports; --format=ctranslate2 writes head_dim=16.'
            },
        ),
    ],
)
def test_the_exports_refuse_a_value_in_one_line_before_asking_for_packages(
    toy, tmp_path, monkeypatch, key, value, reasons
):
    """Each format refuses what its declaration does not name (no format names the toy: its
    default alone exports; CTranslate2 writes any head size and grouped keys/values), the
    others go on to the package check."""
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    workdir, _ = run_dir_with(tmp_path, **{key: value})
    for format in export.FORMATS:
        with pytest.raises(export.ExportError) as info:
            export.export(str(workdir), str(tmp_path / 'out'), format=format)
        if format in reasons:
            line = f'model.{key}={value!r} cannot be exported as --format={format}: '
            assert str(info.value) == line + reasons[format] and len(str(info.value)) <= 200
        else:
            assert 'needs the export extra' in str(info.value)
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('key, value', [(SLOTS, 0), ('num_kv_heads', 4), ('head_dim', 8)])
def test_values_marian_holds_pass_the_refusals(toy, tmp_path, monkeypatch, key, value):
    """The toy's default 0, K = N = 4 and H = D / N = 8 (tiny: D 32): on to the package
    check."""
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    workdir, _ = run_dir_with(tmp_path, **{key: value})
    with pytest.raises(export.ExportError, match='needs the export extra'):
        export.export(str(workdir), str(tmp_path / 'out'))


def test_the_pytorch_peer_refuses_what_the_declaration_says_it_does_not_build(toy, monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', None)  # refused before torch is asked for
    with pytest.raises(torch_peer.Refused) as info:
        torch_peer.main(['--config=tiny', f'--set=model.{SLOTS}=2'])
    assert str(info.value) == (
        f'model.{SLOTS}=2 is not built by the PyTorch peer: it has no memory slots: its time '
        "would be a different model's."
    )
    assert torch_peer.config_shapes('tiny', [f'model.{SLOTS}=0'])['kv_heads'] == 4


def test_a_config_error_names_a_bad_key_value_head_count():
    for value, message in (
        (3, 'model.num_kv_heads=3 must divide model.num_heads=4: each key/value head serves'),
        (0, r'model.num_kv_heads=0 must be an integer >= 1 \(or None\)\.$'),
    ):
        with pytest.raises(fields.ConfigError, match=message):
            TransformerConfig(vocab_size=8, num_heads=4, num_kv_heads=value)


def test_the_decoder_cache_bound_counts_the_key_value_heads():
    full, one = _experiment(), _experiment(num_kv_heads=1)  # tiny: 4 heads
    bytes_of = lambda e: footprint.decode_cache_bytes(e, 8, 4, 20)  # noqa: E731
    assert bytes_of(full) == 4 * bytes_of(one) > 0
