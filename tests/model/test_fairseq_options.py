"""The options of fairseq's translation models (M2M100, NLLB-200, mBART-50), each a registered
entry or a declared setting: fairseq's sinusoids (model.positions='fairseq_sinusoidal') read
from the vocabulary's padding id (``TransformerConfig.special``), the embeddings' scale as a
switch (model.scale_embedding),
BART's and mBART's learned positions (model.positions='bart_learned', model.max_positions) and
a norm on the embedding sums (model.layernorm_embedding). Each against Hugging Face's module
where one exists, through cached decoding, and refused by every export and the PyTorch peer,
which declare no writer for it. The whole models against Hugging Face's:
tests/model/test_fairseq_families.py."""

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.model.test_model import random_params, tiny_config
from tests.tiny_run import run_dir_with, tiny_run_config
from transformer import schema
from transformer.fields import ConfigError
from transformer.model import Packing, Transformer, init_cache, param_count, variants
from transformer.model import positions as positions_lib
from transformer.tokens import SpecialIds

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import torch_peer  # noqa: E402

PAD = 1  # fairseq's dictionaries' padding id: <s> 0, <pad> 1, </s> 2 (the decoder's start)
FAIRSEQ_IDS = SpecialIds(pad=PAD, eos=2, unk=3, decoder_start=2, never_emit=(PAD,))
V, D = 48, 32  # tests/model/test_model.py's tiny_config
FAIRSEQ = {'positions': 'fairseq_sinusoidal', 'special': FAIRSEQ_IDS}
# An M2M100's options: pre-LN with final norms, biased attention projections, fairseq's
# sinusoids; scale_embedding, True in NLLB-200 and M2M100, False here to exercise the switch.
M2M100 = FAIRSEQ | {'pre_layer_norm': True, 'attention_bias': True, 'scale_embedding': False}
# An mBART's: its learned positions, its norm on the embedding sums, its final_logits_bias.
LEARNED = {'positions': 'bart_learned', 'max_positions': 12}
MBART = LEARNED | {'special': FAIRSEQ_IDS, 'pre_layer_norm': True, 'layernorm_embedding': True}
MBART |= {'attention_bias': True, 'logits_bias': True, 'ffn': 'gelu'}


def padded_tokens(seed: int, shape: tuple[int, int], lengths) -> np.ndarray:
    """Ids in [2, V) (neither 0, the decoder's start, nor the padding id), row b padded with
    ``PAD`` after lengths[b] (right padding, as this package pads)."""
    tokens = np.random.default_rng(seed).integers(2, V, shape).astype(np.int32)
    tokens[np.arange(shape[1])[None, :] >= np.asarray(lengths)[:, None]] = PAD
    return tokens


def _added(cfg, positions, valid, d_model: int) -> np.ndarray:
    """What the positions entry of ``cfg`` adds to zero embeddings [B, T, D]."""
    module = variants.chosen(cfg, 'positions').module.stack_module(cfg)
    zeros = jnp.zeros((*positions.shape, d_model), jnp.float32)
    return np.asarray(module.apply({}, zeros, jnp.asarray(positions), jnp.asarray(valid)))


@pytest.mark.slow  # importing transformers' M2M100
@pytest.mark.parametrize('d_model', [16, 15])
def test_fairseq_sinusoids_are_hugging_faces_on_padded_rows(d_model):
    """M2M100SinusoidalPositionalEmbedding on right-padded rows (padding id 1): ours, from
    the row positions 0, 1, ... and the tokens' validity, are its vectors, the padding's zero,
    an odd D's last channel zero; not the paper's interleaved sinusoids."""
    pytest.importorskip('torch', reason="torch is not installed: pip install -e '.[export]'")
    m2m = pytest.importorskip('transformers.models.m2m_100.modeling_m2m_100')
    import torch

    tokens = padded_tokens(0, (3, 9), lengths=[9, 4, 1])
    hf = m2m.M2M100SinusoidalPositionalEmbedding(8, d_model, padding_idx=PAD)
    want = hf(torch.from_numpy(tokens).long()).numpy()
    cfg = tiny_config(d_model=d_model, num_heads=1, **FAIRSEQ)
    positions = np.broadcast_to(np.arange(9), tokens.shape)
    ours = _added(cfg, positions, tokens != PAD, d_model)
    np.testing.assert_allclose(ours, want, atol=2e-6)
    assert not ours[tokens == PAD].any() and np.abs(ours[tokens != PAD]).max() > 0.5
    if d_model == 16:
        paper = np.asarray(positions_lib.sinusoidal_positions(jnp.asarray(positions), 16))
        assert np.abs(ours[0] - paper[0]).max() > 0.5


@pytest.mark.slow  # importing transformers' mBART
def test_learned_positions_are_hugging_faces_rows_from_two_padding_included():
    """MBartLearnedPositionalEmbedding's table in ours: position p reads row p + 2, whether
    its token is padding or not; rows 0 and 1 are never read; past the table, NaN."""
    pytest.importorskip('torch', reason="torch is not installed: pip install -e '.[export]'")
    mbart = pytest.importorskip('transformers.models.mbart.modeling_mbart')
    import torch

    torch.manual_seed(0)
    hf = mbart.MBartLearnedPositionalEmbedding(12, D)
    tokens = padded_tokens(0, (2, 7), lengths=[7, 3])
    want = hf(torch.from_numpy(tokens).long()).detach().numpy()
    cfg = tiny_config(**LEARNED)
    module = variants.chosen(cfg, 'positions').module.stack_module(cfg)
    table = hf.weight.detach().numpy()
    assert table.shape == (14, D)

    def add(positions, valid):
        zeros = jnp.zeros((*positions.shape, D), jnp.float32)
        return np.asarray(module.apply({'params': {'embedding': table}}, zeros, positions, valid))

    positions = jnp.broadcast_to(jnp.arange(7), tokens.shape)
    np.testing.assert_array_equal(add(positions, tokens != PAD), np.broadcast_to(want, (2, 7, D)))
    np.testing.assert_array_equal(
        add(positions, np.ones(tokens.shape, bool)), add(positions, tokens != PAD)
    )
    assert np.isnan(add(jnp.array([[12]]), np.ones((1, 1), bool))).all()


def test_packed_examples_take_their_own_positions():
    """Two examples packed in a row (positions restarting at 0) take the rows each takes
    alone."""
    cfg = tiny_config(**FAIRSEQ)
    packed = _added(cfg, np.array([[0, 1, 2, 0, 1, 0]]), np.array([[1, 1, 1, 1, 1, 0]]), D)
    alone = _added(cfg, np.array([[0, 1, 2], [0, 1, 2]]), np.array([[1, 1, 1], [1, 1, 0]]), D)
    np.testing.assert_array_equal(packed[0, :3], alone[0])
    np.testing.assert_array_equal(packed[0, 3:], alone[1])


def _forward(cfg, params, inputs, targets, packing=None):
    packing = None if packing is None else Packing(**packing)
    return Transformer(cfg).apply({'params': params}, inputs, targets, packing=packing)


def test_padding_id_is_the_models_in_masks_and_positions():
    """With the vocabulary's pad id 1, padding (id 1) appended to the source changes no real
    position's logits, while id 0 is a real token: read as padding, it would change none either."""
    cfg = tiny_config(**FAIRSEQ)
    params = random_params(cfg)
    forward = jax.jit(functools.partial(_forward, cfg))
    inputs = padded_tokens(1, (2, 5), lengths=[5, 3])
    targets = padded_tokens(2, (2, 4), lengths=[4, 2])
    logits = np.asarray(forward(params, inputs, targets))
    more = np.asarray(
        forward(params, np.pad(inputs, ((0, 0), (0, 3)), constant_values=PAD), targets)
    )
    real = targets != PAD
    np.testing.assert_allclose(more[real], logits[real], atol=1e-5)
    zeros = np.asarray(forward(params, np.pad(inputs, ((0, 0), (0, 3))), targets))
    assert np.abs(zeros[real] - logits[real]).max() > 1e-3


def cached_equals_teacher_forced(cfg, atol: float = 1e-5) -> None:
    """Greedy steps with the key/value cache, fed the decoder's start then each target,
    give the teacher-forced logits at every real target position."""
    model = Transformer(cfg)
    params = random_params(cfg)
    b, t = 2, 6
    inputs = padded_tokens(3, (b, 5), lengths=[5, 3])
    targets = padded_tokens(4, (b, t), lengths=[6, 4])
    full = np.asarray(jax.jit(functools.partial(_forward, cfg))(params, inputs, targets))
    # Compiled: one program costs less than the encoder's ops run one by one.
    encode = jax.jit(functools.partial(model.apply, method=Transformer.encode))
    encoded = encode({'params': params}, inputs)

    @jax.jit
    def step(cache, token):
        return model.apply(
            {'params': params, 'cache': cache},
            encoded,
            inputs,
            token,
            decode=True,
            method=Transformer.decode,
            mutable=['cache'],
        )

    cache = jax.jit(init_cache, static_argnums=(0, 4))(model, params, encoded, inputs, t)
    previous, stepwise = np.full((b, 1), cfg.special.decoder_start, np.int32), []
    for pos in range(t):
        logits, state = step(cache, previous)
        cache = state['cache']
        stepwise.append(np.asarray(logits[:, 0]))
        previous = targets[:, pos : pos + 1]
    real = targets != cfg.special.pad
    np.testing.assert_allclose(np.stack(stepwise, axis=1)[real], full[real], atol=atol)


@pytest.mark.parametrize('scale_embedding', [True, False])
def test_embeddings_are_scaled_by_sqrt_d_model_only_with_scale_embedding(scale_embedding):
    """The encoder's input before dropout: the embedding rows times sqrt(D) (Sec. 3.4), or the
    rows as they are, plus the positions (fairseq's here)."""
    cfg = tiny_config(scale_embedding=scale_embedding, **FAIRSEQ)
    params = random_params(cfg)
    tokens = padded_tokens(5, (2, 4), lengths=[4, 2])
    positions, valid = np.broadcast_to(np.arange(4), tokens.shape), tokens != PAD

    def embed(model, tokens):
        return model._embed('encoder', tokens, positions, valid, True)

    ours = np.asarray(Transformer(cfg).apply({'params': params}, tokens, method=embed))
    rows = np.asarray(params['shared_embedding']['embedding'])[tokens]
    scaled = rows * np.sqrt(cfg.d_model) if scale_embedding else rows
    np.testing.assert_allclose(ours, scaled + _added(cfg, positions, valid, D), atol=1e-6)


@pytest.mark.parametrize('stack', ['encoder', 'decoder'])
def test_layernorm_embedding_norms_each_stacks_embedding_sum(stack):
    """model.layernorm_embedding: LayerNorm(rows x sqrt(D) + positions) with the stack's own
    scale and bias, before the dropout; the learned positions from the stack's own table."""
    cfg = tiny_config(**MBART, layer_norm_epsilon=1e-5)
    params = random_params(cfg)
    tokens = padded_tokens(6, (2, 4), lengths=[4, 2])
    positions, valid = np.broadcast_to(np.arange(4), tokens.shape), tokens != PAD

    def embed(model, tokens):
        return model._embed(stack, tokens, positions, valid, True)

    ours = np.asarray(Transformer(cfg).apply({'params': params}, tokens, method=embed))
    x = np.asarray(params['shared_embedding']['embedding'], np.float64)[tokens] * np.sqrt(D)
    x = x + np.asarray(params[f'{stack}_positions']['embedding'])[positions + 2]
    norm = params[f'{stack}_embedding_norm']
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * norm['scale'] + norm['bias']
    np.testing.assert_allclose(ours, want, atol=2e-5)


def test_the_learned_tables_and_norms_are_declared_counted_and_replicated():
    """The parameter tree is the declared one (two [max_positions + 2, D] tables, two norms),
    the count holds them, and the tables' rows are the logical axis 'positions', which the
    sharding rules replicate."""
    from jax.sharding import PartitionSpec

    from transformer.model import abstract_params, logical_partition_specs, param_shapes
    from transformer.training import parallel

    cfg = tiny_config(**MBART)
    tree = {
        '/'.join(k.key for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_params(Transformer(cfg)))
    }
    assert param_shapes(cfg) == tree
    new = ('_positions', '_embedding_norm')
    norms = {
        f'{s}_embedding_norm/{n}': (D,) for s in ('encoder', 'decoder') for n in ('scale', 'bias')
    }
    assert {k: v for k, v in tree.items() if k.split('/')[0].endswith(new)} == {
        'encoder_positions/embedding': (14, D),
        'decoder_positions/embedding': (14, D),
        **norms,
    }
    without = tiny_config(**MBART | FAIRSEQ | {'max_positions': None, 'layernorm_embedding': False})
    assert param_count(cfg) - param_count(without) == 2 * 14 * D + 4 * D
    specs = logical_partition_specs(Transformer(cfg))
    assert specs['encoder_positions']['embedding'] == PartitionSpec('positions', 'embed')
    assert dict(parallel.rules(fsdp=False))['positions'] is None


@pytest.mark.long
@pytest.mark.parametrize('overrides', [M2M100, MBART], ids=['m2m100', 'mbart'])
def test_cached_decoding_equals_teacher_forcing(overrides):
    """In the long tier: the families' own networks with these options decode through the
    cache step by step to Hugging Face's greedy tokens and scores, and their teacher-forced
    logits are Hugging Face's (tests/model/test_fairseq_families.py:
    test_greedy_steps_with_the_cache_equal_hugging_faces_generation and
    test_teacher_forced_logits_equal_hugging_faces): cached steps and teacher forcing agree
    through both."""
    cached_equals_teacher_forced(tiny_config(num_decoder_layers=2, **overrides))


def test_the_options_add_no_parameters_and_bad_values_are_one_line():
    assert param_count(tiny_config(**FAIRSEQ)) == param_count(tiny_config())
    outside = SpecialIds(pad=V, eos=2, unk=3, decoder_start=2, never_emit=())
    with pytest.raises(ConfigError, match=r'^The special ids .* ids of the vocabulary of 48'):
        tiny_config(special=outside)
    with pytest.raises(ConfigError, match=r'^model.d_model=2 is too narrow for model.positions'):
        tiny_config(d_model=2, num_heads=1, positions='fairseq_sinusoidal')
    with pytest.raises(ConfigError, match=r"^model.positions='bart_learned' learns a table of "):
        tiny_config(positions='bart_learned')
    with pytest.raises(ConfigError, match=r'^model.max_positions=12 sizes a learned position '):
        tiny_config(max_positions=12)
    config = tiny_run_config(1)  # data.max_len=32
    config.model.update(LEARNED | {'max_positions': 31})
    with pytest.raises(ConfigError, match=r'^data.max_len=32 exceeds model.max_positions=31: '):
        schema.parse(config)
    config.model.max_positions = 32
    assert schema.parse(config).model.max_positions == 32


# What the Hugging Face export (MarianMT's layout, for a run of no pretrained family) says of
# each option, naming the format that writes it: CTranslate2's writer does
# (tests/test_export_ctranslate2.py's option cases).
REFUSED = {
    'positions': (
        'fairseq_sinusoidal',
        "MarianMT adds sinusoids to the embeddings; only positions='sinusoidal' exports to it; "
        "--format=ctranslate2 writes positions='fairseq_sinusoidal'.",
    ),
    'positions_learned': (
        'bart_learned',
        "MarianMT adds sinusoids to the embeddings; only positions='sinusoidal' exports to it; "
        "--format=ctranslate2 writes positions='bart_learned'.",
    ),
    'layernorm_embedding': (
        True,
        'MarianMT writes layernorm_embedding=False only; --format=ctranslate2 writes '
        'layernorm_embedding=True.',
    ),
    'scale_embedding': (
        False,
        'MarianMT writes scale_embedding=True only; --format=ctranslate2 writes '
        'scale_embedding=False.',
    ),
}


@pytest.mark.parametrize('field', REFUSED)
def test_the_hf_export_refuses_the_option_before_writing_and_names_the_format_that_writes_it(
    field, tmp_path, monkeypatch
):
    import importlib.util

    from transformer.commands import export

    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    value, reason = REFUSED[field]
    field = field.removesuffix('_learned')
    table = {'max_positions': 64} if value == 'bart_learned' else {}
    workdir, _ = run_dir_with(tmp_path, **{field: value}, **table)
    with pytest.raises(export.ExportError) as info:
        export.export(str(workdir), str(tmp_path / 'out'), format='hf')
    assert str(info.value) == f'model.{field}={value!r} cannot be exported as --format=hf: {reason}'
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('field', ['positions', 'layernorm_embedding', 'scale_embedding'])
def test_the_pytorch_peer_refuses_the_option(field, monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', None)  # refused before torch is asked for
    value = REFUSED[field][0]
    with pytest.raises(torch_peer.Refused, match=f'^model.{field}={value!r} is not built'):
        torch_peer.main(['--config=tiny', f'--set=model.{field}={value}'])


@pytest.mark.parametrize(
    'field, value', [('scale_embedding', False), ('layernorm_embedding', True)]
)
def test_a_resume_that_changes_the_option_is_refused(field, value, tmp_path):
    from transformer import run_changes, rundir

    workdir, config = run_dir_with(tmp_path)
    default = getattr(schema.parse(config).model, field)  # what the run directory holds
    config.model[field] = value
    with pytest.raises(rundir.WorkdirError, match=f'model.{field}={default!r}, not {value!r}'):
        run_changes.resume_changes(str(workdir), schema.parse(config))
