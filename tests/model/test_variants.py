"""transformer/model/variants.py: a variant registered with its module is all a new choice
takes. The test registers a toy gated feed-forward (GLU-style, Shazeer 2020, "GLU Variants
Improve Transformer") and nothing else; the config, the parameter count, the FLOPs, the memory
bound, the exports and resuming learn it from that entry."""

import functools
import math

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from tests.tiny_run import tiny_run_config
from transformer import rundir, schema
from transformer.commands import export
from transformer.fields import ConfigError
from transformer.model import Transformer, TransformerConfig, flops, param_shapes, variants
from transformer.training import footprint

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


GATED = variants.Variant(
    'ffn',
    'gated',
    lambda cfg: {
        'gate/kernel': (cfg.d_model, cfg.d_ff),
        'up/kernel': (cfg.d_model, cfg.d_ff),
        'down/kernel': (cfg.d_ff, cfg.d_model),
    },
    'GLU variants (Shazeer, 2020)',
    module=GatedFeedForward,
    exports=(),
    unexportable='MarianMT has no gated feed-forward; only ffn=relu exports.',
)


@pytest.fixture
def gated():
    variants.register(GATED)
    yield GATED
    variants.unregister('ffn', 'gated')


@functools.cache
def _shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """The model's parameter shapes by path, from ``jax.eval_shape`` of its init."""
    tokens = jnp.ones((1, 3), jnp.int32)
    tree = nn.unbox(jax.eval_shape(Transformer(cfg).init, jax.random.key(0), tokens, tokens))
    return {
        '/'.join(k.key for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree['params'])
    }


def test_a_value_is_accepted_once_registered_and_named_in_the_model_line():
    with pytest.raises(ConfigError, match=r"model.ffn='gated' must be one of 'relu'\.$"):
        TransformerConfig(vocab_size=8, ffn='gated')
    variants.register(GATED)
    try:
        cfg = TransformerConfig(vocab_size=8, ffn='gated')
        assert variants.chosen(cfg, 'ffn').module is GatedFeedForward
        assert "ffn='gated'" in variants.describe(cfg)  # the training log's model line
        with pytest.raises(ConfigError, match=r"must be one of 'relu', 'gated'\.$"):
            TransformerConfig(vocab_size=8, ffn='swish')
    finally:
        variants.unregister('ffn', 'gated')


@pytest.mark.parametrize(
    'overrides',
    [{}, {'ffn': 'gated'}, {'pre_layer_norm': True}, {'share_embeddings': 'none', 'head_dim': 4}],
)
def test_declared_weights_are_the_models_parameter_tree(gated, overrides):
    """Every path and shape the variants declare is the model's, and no other: so the count,
    the FLOPs and the memory bound read from them describe the network that runs."""
    cfg = TransformerConfig(**SMALL | overrides)
    assert param_shapes(cfg) == _shapes(cfg)
    assert variants.param_count(cfg) == sum(map(math.prod, _shapes(cfg).values()))


def test_flops_and_memory_bound_follow_the_registered_variant(gated):
    """The gated feed-forward's three products show in the FLOPs, two per multiply-add of
    each FFN kernel of ``jax.eval_shape`` on every token; the layers' weights of the memory
    bound are the layers' parameters of ``jax.eval_shape``."""
    relu, glu = TransformerConfig(**SMALL), TransformerConfig(**SMALL, ffn='gated')
    batch, s, t = 2, 5, 3

    def ffn_products(cfg):  # per token
        shapes = _shapes(cfg).items()
        return sum(math.prod(v) for k, v in shapes if k.startswith('encoder_layer_0/ffn/'))

    assert ffn_products(glu) == 3 * 16 * 24  # kernels only: the toy has no biases
    tokens = batch * (relu.num_encoder_layers * s + relu.num_decoder_layers * t)
    # The ReLU FFN's kernels: its parameters less its biases (F + D).
    difference = 2 * tokens * (ffn_products(glu) - (ffn_products(relu) - 24 - 16))
    assert (
        flops.forward_flops(glu, batch, s, t) - flops.forward_flops(relu, batch, s, t) == difference
    )
    config = tiny_run_config(1)
    config.model.update(SMALL | {'ffn': 'gated'})
    del config.model['vocab_size']
    experiment = schema.parse(config)
    in_layers = sum(math.prod(v) for k, v in _shapes(experiment.model).items() if '_layer_' in k)
    assert footprint.layer_params(experiment) == in_layers


def _run_with(tmp_path, **model):
    """A run directory holding config.json (and a vocabulary file) of the tiny config."""
    config = tiny_run_config(1)
    config.model.update(model)
    workdir = tmp_path / 'run'
    workdir.mkdir(exist_ok=True)
    rundir.write_config(str(workdir), schema.parse(config))
    vocab = rundir.vocab_path(config, str(workdir))
    (tmp_path / 'run' / 'vocab').mkdir(exist_ok=True)
    open(vocab, 'w').close()
    return workdir, config


def test_export_refuses_the_variant_before_asking_for_its_packages(gated, tmp_path, monkeypatch):
    """A run of a variant no format represents is refused in one line naming the field, not
    told to install the export extra (which is missing here)."""
    import importlib.util

    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    workdir, _ = _run_with(tmp_path, ffn='gated')
    for format in export.FORMATS:
        with pytest.raises(export.ExportError) as info:
            export.export(str(workdir), str(tmp_path / 'out'), format=format)
        assert str(info.value) == (
            f"model.ffn='gated' cannot be exported as --format={format}: "
            'MarianMT has no gated feed-forward; only ffn=relu exports.'
        )
    # The paper's feed-forward passes the refusals and reaches the package check.
    workdir, _ = _run_with(tmp_path, ffn='relu')
    with pytest.raises(export.ExportError, match='needs the export extra'):
        export.export(str(workdir), str(tmp_path / 'out'))
    assert not (tmp_path / 'out').exists()


def test_a_resume_that_changes_the_variant_is_refused(gated, tmp_path):
    workdir, config = _run_with(tmp_path, ffn='relu')
    config.model.ffn = 'gated'
    with pytest.raises(rundir.WorkdirError, match="model.ffn='relu', not 'gated'"):
        rundir.resume_changes(str(workdir), schema.parse(config))
