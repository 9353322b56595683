"""benchmarks/torch_peer.py builds the config's model or refuses it in one line: what it would
build is checked without torch (its settings and parameter count against the project's own
model), and against the module it builds where torch is installed."""

import sys
from pathlib import Path

import pytest

from transformer import configs, schema
from transformer.model import config_from_dict, param_count

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'benchmarks'))

import torch_peer  # noqa: E402

MIRRORED = [
    {},
    {'pre_layer_norm': True, 'head_dim': 24, 'layer_norm_epsilon': 1e-5},
    {'attention_dropout_rate': 0.2, 'relu_dropout_rate': 0.3},
    {'num_kv_heads': 2},
    {'ffn': 'swish', 'attention_bias': True, 'logits_bias': True, 'num_kv_heads': 2},
    {'ffn': 'gelu', 'logits_bias': True},
]


@pytest.mark.parametrize('name', ['tiny', 'base'])
@pytest.mark.parametrize('model', MIRRORED)
def test_the_peer_builds_the_configs_model(name, model):
    """Not refused; the settings it reads are the model's, and the parameters it would make
    are as many as the project's model has (same vocabulary)."""
    shapes = torch_peer.config_shapes(name, [f'model.{k}={v}' for k, v in model.items()])
    config = configs.load(name)
    config.model.update(model)
    m = schema.parse(config).model
    assert shapes['head_dim'] == (m.head_dim or m.d_model // m.num_heads)
    assert shapes['kv_heads'] == (m.num_kv_heads or m.num_heads)
    assert shapes['epsilon'] == m.layer_norm_epsilon
    assert (shapes['dropout'], shapes['attention_dropout'], shapes['relu_dropout']) == (
        m.dropout_rate,
        m.attention_dropout_rate,
        m.relu_dropout_rate,
    )
    assert shapes['pre_ln'] == m.pre_layer_norm
    assert (shapes['ffn'], shapes['attention_bias'], shapes['logits_bias']) == (
        m.ffn,
        m.attention_bias,
        m.logits_bias,
    )
    assert torch_peer.param_count(shapes) == param_count(config_from_dict(m, shapes['vocab']))


@pytest.mark.parametrize(
    'setting, line',
    [
        (
            'model.ffn=gated',
            "model.ffn='gated' is not built by the PyTorch peer (it builds 'relu' or 'swish' "
            "or 'gelu')",
        ),
        (
            'model.share_embeddings=none',
            "model.share_embeddings='none' is not built by the PyTorch peer (it builds 'all')",
        ),
        (
            'model.norm=rms_norm',
            "model.norm='rms_norm' is not built by the PyTorch peer (it builds 'layer_norm')",
        ),
        (
            'model.positions=rope',
            "model.positions='rope' is not built by the PyTorch peer (it builds 'sinusoidal')",
        ),
        (
            'model.ffn=swiglu',
            "model.ffn='swiglu' is not built by the PyTorch peer (it builds 'relu' or 'swish' "
            "or 'gelu')",
        ),
        (
            'model.qk_norm=True',
            'model.qk_norm=True is not built by the PyTorch peer: the peer has no norm on '
            'queries and keys.',
        ),
    ],
)
def test_the_peer_refuses_a_model_it_does_not_build_in_one_line(monkeypatch, setting, line):
    """Before it asks for torch (missing here): a time of another model is never written."""
    monkeypatch.setitem(sys.modules, 'torch', None)
    with pytest.raises(torch_peer.Refused) as info:
        torch_peer.main(['--config=tiny', f'--set={setting}', '--modes=eager'])
    assert str(info.value) == f"{line}: its time would be a different model's."


def test_the_built_module_has_the_counted_parameters():
    torch = pytest.importorskip('torch')
    shapes = torch_peer.config_shapes('tiny', [f'model.{k}={v}' for k, v in MIRRORED[1].items()])
    model = torch_peer.build(torch, shapes)
    assert sum(p.numel() for p in model.parameters()) == torch_peer.param_count(shapes)
    assert model.encoder[0].norms[0].eps == 1e-5 and len(model.final_norms) == 2
    assert model.encoder[0].parts[0].q.weight.shape == (4 * 24, 128)  # [N*H, D], head_dim 24


def test_the_built_module_groups_key_value_heads():
    """model.num_kv_heads=2 of 4 heads: [K*H, D] key and value layers, and a forward pass
    through scaled_dot_product_attention's grouped heads."""
    torch = pytest.importorskip('torch')
    shapes = torch_peer.config_shapes('tiny', ['model.num_kv_heads=2'])
    shapes |= {'length': 4, 'encoder_layers': 1, 'decoder_layers': 1}
    model = torch_peer.build(torch, shapes).eval()
    attention = model.decoder[0].parts[1]
    assert attention.k.weight.shape == attention.v.weight.shape == (2 * 32, 128)
    assert sum(p.numel() for p in model.parameters()) == torch_peer.param_count(shapes)
    tokens = torch.ones((1, 4), dtype=torch.long)
    assert model(tokens, tokens).shape == (1, 4, shapes['vocab'])


def test_the_built_module_has_the_marian_options():
    """model.ffn='gelu' (exact, erf), attention biases and a fixed logits bias: the parameters
    counted, each attention's four projections biased, the activation the exact GELU, the bias
    excluded from training (opt.train_logits_bias's default) and added to the logits."""
    torch = pytest.importorskip('torch')
    settings = ['model.ffn=gelu', 'model.attention_bias=True', 'model.logits_bias=True']
    shapes = torch_peer.config_shapes('tiny', settings)
    shapes |= {'length': 4, 'encoder_layers': 1, 'decoder_layers': 1}
    model = torch_peer.build(torch, shapes).eval()
    assert sum(p.numel() for p in model.parameters()) == torch_peer.param_count(shapes)
    attention = model.decoder[0].parts[1]
    assert all(layer.bias is not None for layer in (attention.q, attention.k, attention.v))
    activation = model.encoder[0].ffn[1]
    assert isinstance(activation, torch.nn.GELU) and activation.approximate == 'none'
    assert not model.logits_bias.requires_grad
    tokens = torch.ones((1, 4), dtype=torch.long)
    with torch.no_grad():
        plain = model(tokens, tokens)
        model.logits_bias[3] = 2.0
        shifted = model(tokens, tokens)
    added = torch.where(torch.arange(shapes['vocab']) == 3, 2.0, 0.0)
    torch.testing.assert_close(shifted - plain, added.expand_as(plain))


def test_a_variant_field_the_peer_does_not_list_is_refused_even_at_its_default(monkeypatch):
    """A part added to the registry is refused until the peer builds it (and BUILDS says so):
    its default value included, so a time is never one of a model built as something else."""
    monkeypatch.setitem(sys.modules, 'torch', None)
    monkeypatch.delitem(torch_peer.BUILDS, 'positions')
    with pytest.raises(torch_peer.Refused, match=r"^model\.positions='sinusoidal' is not built"):
        torch_peer.main(['--config=tiny', '--modes=eager'])
