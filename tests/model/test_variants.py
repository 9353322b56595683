"""transformer/model/variants.py: a variant registered with its module is all a new choice
takes. The test registers, for two parts, exactly an entry and its module: a toy gated
feed-forward (GLU-style, Shazeer 2020, "GLU Variants Improve Transformer") and a toy norm
(RMSNorm, Zhang & Sennrich 2019: a scale and no bias); the config, --help, the parameter count,
the FLOPs, the memory bound, resuming and the PyTorch peer learn them from that entry, and every
export refuses them, as it refuses every value its format does not declare (transformer/
formats.py; docs/model_variants.md)."""

import functools
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from tests.tiny_run import run_dir_with, tiny_run_config
from transformer import interop, run_changes, rundir, schema
from transformer.commands import ctranslate2_spec, export
from transformer.fields import ConfigError
from transformer.model import (
    Transformer,
    TransformerConfig,
    abstract_params,
    flops,
    param_shapes,
    variants,
)
from transformer.training import footprint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import torch_peer  # noqa: E402

SMALL = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=24)


class GatedFeedForward(nn.Module):
    """(silu(x W_gate) * x W_up) W_down, no biases."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, deterministic):
        cfg = self.config
        dense = lambda n, name: nn.Dense(n, use_bias=False, name=name)  # noqa: E731
        h = nn.silu(dense(cfg.d_ff, 'gate')(x)) * dense(cfg.d_ff, 'up')(x)
        h = nn.Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
        return dense(cfg.d_model, 'down')(h)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + epsilon) * scale."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x):
        scale = self.param('scale', nn.initializers.ones, (self.config.d_model,))
        mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(mean_square + self.config.layer_norm_epsilon) * scale


TOYS = {
    'ffn': variants.Variant(
        'ffn',
        'toy_gated',
        lambda cfg: {
            'gate/kernel': (cfg.d_model, cfg.d_ff),
            'up/kernel': (cfg.d_model, cfg.d_ff),
            'down/kernel': (cfg.d_ff, cfg.d_model),
        },
        'GLU variants (Shazeer, 2020)',
        module=GatedFeedForward,
    ),
    'norm': variants.Variant(
        'norm',
        'toy_rms',
        lambda cfg: {'scale': (cfg.d_model,)},
        'RMSNorm (Zhang and Sennrich, 2019)',
        module=RMSNorm,
    ),
}
BUILT = {'ffn': 'relu', 'norm': 'layer_norm'}  # the paper's entry of each part


@pytest.fixture
def toys():
    for toy in TOYS.values():
        variants.register(toy)
    yield TOYS
    for toy in TOYS.values():
        variants.unregister(toy.part, toy.value)


@functools.cache
def _shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """The model's parameter shapes by path, from ``jax.eval_shape`` of its init: traced once
    per config (a 6 + 6-layer model's trace takes a while), the toys' configs included."""
    return {
        '/'.join(k.key for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_params(Transformer(cfg)))
    }


@pytest.mark.parametrize('part', TOYS)
def test_a_value_is_accepted_once_registered_and_named_in_the_model_line(part, capsys):
    toy = TOYS[part]
    registered = ', '.join(map(repr, variants.choices(part)))  # the paper's entry first
    assert registered.startswith(repr(BUILT[part]))
    with pytest.raises(
        ConfigError, match=re.escape(f"model.{part}='{toy.value}' must be one of {registered}.")
    ):
        TransformerConfig(vocab_size=8, **{part: toy.value})
    variants.register(toy)
    try:
        cfg = TransformerConfig(vocab_size=8, **{part: toy.value})
        assert variants.chosen(cfg, part).module is toy.module
        assert f'{part}={toy.value!r}' in variants.describe(cfg)  # the training log's model line
        with pytest.raises(
            ConfigError, match=re.escape(f"must be one of {registered}, '{toy.value}'.") + '$'
        ):
            TransformerConfig(vocab_size=8, **{part: 'unheard_of'})
        from transformer.commands import train

        with pytest.raises(SystemExit):
            train.cli(['train', '--config=tiny', '--help'])
        line = next(x for x in capsys.readouterr().out.splitlines() if f'model.{part} =' in x)
        assert line.endswith(f"(one of {registered}, '{toy.value}')")
    finally:
        variants.unregister(part, toy.value)


@pytest.mark.parametrize(
    'overrides',
    [
        {},
        {'ffn': 'toy_gated'},
        {'pre_layer_norm': True},
        {'norm': 'toy_rms'},
        {'norm': 'toy_rms', 'pre_layer_norm': True, 'ffn': 'toy_gated'},
        {'norm': 'rms_norm', 'ffn': 'swiglu', 'positions': 'rope', 'qk_norm': True},
        {'norm': 'rms_norm', 'pre_layer_norm': True, 'ffn': 'geglu', 'num_kv_heads': 1},
        {'share_embeddings': 'none', 'head_dim': 4},
        {'num_kv_heads': 1, 'head_dim': 4},
        {'ffn': 'swish', 'attention_bias': True, 'logits_bias': True},
        {'attention_bias': True, 'num_kv_heads': 1, 'head_dim': 4, 'logits_bias': True},
        {'ffn': 'gelu', 'logits_bias': True, 'share_embeddings': 'none'},
    ],
)
def test_declared_weights_are_the_models_parameter_tree(toys, overrides):
    """Every path and shape the variants declare is the model's, and no other: so the count,
    the FLOPs and the memory bound read from them describe the network that runs."""
    cfg = TransformerConfig(**SMALL | overrides)
    assert param_shapes(cfg) == _shapes(cfg)
    assert variants.param_count(cfg) == sum(map(math.prod, _shapes(cfg).values()))


def _products(cfg: TransformerConfig, stack: str) -> int:
    """Multiply-adds per token of one layer of ``stack``'s weights of two or more axes, read
    from ``jax.eval_shape``: the attention's are left out (the toys do not change them)."""
    return sum(
        math.prod(v)
        for k, v in _shapes(cfg).items()
        if k.startswith(f'{stack}_layer_0/') and 'attention/' not in k and len(v) > 1
    )


@pytest.mark.parametrize('part', TOYS)
@pytest.mark.parametrize('pre_layer_norm', [False, True])
def test_flops_and_memory_bound_follow_the_registered_variant(toys, part, pre_layer_norm):
    """The toy's weight products show in the FLOPs, two per multiply-add of each of its
    ``jax.eval_shape`` weights on every token (the gated FFN's three kernels; none for the
    norm, whose scale is a vector); the layers' weights of the memory bound are the layers'
    parameters of ``jax.eval_shape``."""
    base = TransformerConfig(**SMALL, pre_layer_norm=pre_layer_norm)
    toy = TransformerConfig(**SMALL, pre_layer_norm=pre_layer_norm, **{part: TOYS[part].value})
    batch, s, t = 2, 5, 3
    difference = sum(
        2 * batch * length * layers * (_products(toy, stack) - _products(base, stack))
        for stack, length, layers in (('encoder', s, 6), ('decoder', t, 6))
    )
    # Three [16, 24] kernels for the ReLU FFN's two; nothing for the norm.
    assert difference == (2 * batch * (s + t) * 6 * (3 - 2) * 16 * 24 if part == 'ffn' else 0)
    assert flops.forward_flops(toy, batch, s, t) - flops.forward_flops(base, batch, s, t) == (
        difference
    )
    config = tiny_run_config(1)
    config.model.update(SMALL | {part: TOYS[part].value, 'pre_layer_norm': pre_layer_norm})
    del config.model['vocab_size']
    experiment = schema.parse(config)
    in_layers = sum(math.prod(v) for k, v in _shapes(experiment.model).items() if '_layer_' in k)
    assert footprint.layer_params(experiment) == in_layers


# What each format says of the toys: the values its declaration names.
REFUSALS = {
    ('ffn', 'hf'): "MarianMT's feed-forward has no gate, and its activation is named by "
    "transformers; only ffn='relu', 'swish' or 'gelu' exports to it.",
    ('ffn', 'ctranslate2'): "CTranslate2 writes ffn='relu', 'swish', 'gelu', 'swiglu', "
    "'geglu' or 'geglu_tanh' only.",
    ('norm', 'hf'): "MarianMT's norms are LayerNorms; only norm='layer_norm' exports to it.",
    ('norm', 'ctranslate2'): "CTranslate2 writes norm='layer_norm' or 'rms_norm' only.",
}


@pytest.mark.parametrize('part', TOYS)
def test_export_refuses_the_variant_before_asking_for_its_packages(
    toys, part, tmp_path, monkeypatch
):
    """A run of a variant no format declares is refused in one line naming the field, not
    told to install the export extra (which is missing here)."""
    import importlib.util

    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    toy = TOYS[part]
    workdir, _ = run_dir_with(tmp_path, **{part: toy.value})
    for format in export.FORMATS:
        with pytest.raises(export.ExportError) as info:
            export.export(str(workdir), str(tmp_path / 'out'), format=format)
        assert str(info.value) == (
            f'model.{part}={toy.value!r} cannot be exported as --format={format}: '
            + REFUSALS[part, format]
        )
    # The paper's entry passes the refusals and reaches the package check.
    workdir, _ = run_dir_with(tmp_path, **{part: BUILT[part]})
    with pytest.raises(export.ExportError, match='needs the export extra'):
        export.export(str(workdir), str(tmp_path / 'out'))
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('part', TOYS)
def test_a_resume_that_changes_the_variant_is_refused(toys, part, tmp_path):
    workdir, config = run_dir_with(tmp_path, **{part: BUILT[part]})
    config.model[part] = TOYS[part].value
    message = f'model.{part}={BUILT[part]!r}, not {TOYS[part].value!r}'
    with pytest.raises(rundir.WorkdirError, match=message):
        run_changes.resume_changes(str(workdir), schema.parse(config))


@pytest.mark.parametrize('part', TOYS)
def test_the_pytorch_peer_refuses_the_variant(toys, part, monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', None)  # refused before torch is asked for
    with pytest.raises(torch_peer.Refused, match=f'model.{part}={TOYS[part].value!r} is not'):
        torch_peer.main(['--config=tiny', f'--set=model.{part}={TOYS[part].value}'])


@pytest.fixture
def toy_positions():
    """A positions entry registered as a new user would, with its module and nothing about
    the exports: the sinusoid's module under another name."""
    from transformer.model.positions import PositionEncoding

    toy = variants.Variant(
        'positions', 'toy', variants.nothing, 'a test', module=PositionEncoding(True, False)
    )
    variants.register(toy)
    yield toy
    variants.unregister('positions', 'toy')


def test_every_format_refuses_an_entry_it_does_not_declare_before_writing(
    toy_positions, tmp_path, monkeypatch
):
    """No format names 'toy' among the positions it writes: the command refuses it in one line
    naming the field and what the format writes, and so does each writer called directly,
    before it writes a file (it would have written sinusoids, a different model)."""
    import importlib.util

    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    workdir, config = run_dir_with(tmp_path, positions='toy')
    reasons = {
        'hf': 'MarianMT adds sinusoids to the embeddings; only '
        "positions='sinusoidal' exports to it.",
        'ctranslate2': "CTranslate2 writes positions='sinusoidal', 'rope', 'fairseq_sinusoidal', "
        "'bart_learned' or 't5_relative' only.",
    }
    for format in export.FORMATS:
        line = f"model.positions='toy' cannot be exported as --format={format}: {reasons[format]}"
        with pytest.raises(export.ExportError) as info:
            export.export(str(workdir), str(tmp_path / 'out'), format=format)
        assert str(info.value) == line
        assert not (tmp_path / 'out').exists()
    cfg = schema.parse(config).model
    writers = [
        ('hf', f.name, functools.partial(f.write, length_exponent=0.0)) for f in interop.FAMILIES
    ]
    ct2 = ('ctranslate2', 'ct2', ctranslate2_spec.write_ctranslate2)
    for format, name, write in (*writers, ct2):
        directory = tmp_path / name
        directory.mkdir()
        # A pre-LN family refuses this post-LN model for that first; any refusal comes first.
        field = "positions='toy'" if name in ('marian', 'ct2') else r'\w+=\S+'
        with pytest.raises(
            export.ExportError, match=f'model.{field} cannot be exported as --format={format}'
        ):
            write(str(directory), cfg, None, None, None)
        assert not list(directory.iterdir())


def test_a_registered_value_is_not_replaced():
    """Registering a value its part has is refused in one line, and the entry stays."""
    sinusoidal = variants.chosen(TransformerConfig(vocab_size=8), 'positions')
    again = variants.Variant('positions', 'sinusoidal', variants.nothing, 'another')
    with pytest.raises(ValueError) as info:
        variants.register(again)
    assert str(info.value) == (
        "the positions 'sinusoidal' is registered already (Sec. 3.5: sinusoids added to the "
        'scaled embeddings); register it under a new name.'
    )
    assert variants.chosen(TransformerConfig(vocab_size=8), 'positions') is sinusoidal
