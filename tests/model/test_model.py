"""Tests of transformer/model/transformer.py: causality, padding, tying, packing, the decode
cache, size.

Equivalence tests use random parameters drawn in numpy (LayerNorm scales and biases included,
so that nothing hides behind an init of ones and zeros) on the real parameter tree from
``jax.eval_shape(model.init)``: compiling the real threefry initialisers would cost seconds
per config on CPU, and these properties must hold for any parameter values.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from tests.random_params import fill_random
from transformer.model import (
    PAD_ID,
    Packing,
    Transformer,
    TransformerConfig,
    config_from_dict,
    encode,
    init_cache,
    param_count,
    sinusoidal_positions,
)
from transformer.model.layers import EncoderLayer, LayerFlags
from transformer.model.masks import AttentionInputs

V, D = 48, 32  # V != D and neither equals F, so a [V, D] parameter is only an embedding


def tiny_config(**overrides) -> TransformerConfig:
    kwargs = dict(
        vocab_size=V,
        d_model=D,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout_rate=0.0,
        attention_impl='einsum',  # the same path on every backend
    )
    return TransformerConfig(**(kwargs | overrides))


def random_params(cfg: TransformerConfig, seed: int = 0) -> dict:
    """Random values on the Transformer's real parameter tree."""
    tokens = jnp.ones((1, 2), jnp.int32)
    shapes = nn.unbox(
        jax.eval_shape(Transformer(cfg).init, jax.random.key(0), tokens, tokens)['params']
    )
    return fill_random(shapes, seed)


def random_tokens(seed: int, shape: tuple[int, ...], lengths=None) -> np.ndarray:
    """Non-padding ids in [2, V); with ``lengths``, row b is padded after lengths[b]."""
    tokens = np.random.default_rng(seed).integers(2, V, shape).astype(np.int32)
    if lengths is not None:
        tokens[np.arange(shape[1])[None, :] >= np.asarray(lengths)[:, None]] = PAD_ID
    return tokens


@functools.partial(jax.jit, static_argnames='cfg')
def forward(cfg, params, inputs, targets, packing=None):
    """Teacher-forced logits [B, T, V]; ``packing``: a dict of `Packing`'s four arrays."""
    packing = None if packing is None else Packing(**packing)
    return Transformer(cfg).apply({'params': params}, inputs, targets, packing=packing)


@functools.partial(jax.jit, static_argnames='cfg')
def encode_and_forward(cfg, params, inputs, targets):
    """Encoder output [B, S, D] and logits [B, T, V] from one compiled call."""
    return Transformer(cfg).apply(
        {'params': params}, inputs, targets, method=lambda m, x, y: (m.encode(x), m(x, y))
    )


def test_decoder_is_causal():
    """Logits at position t (which predicts targets[:, t]) do not change when any target
    after t changes, while later positions do change (so the perturbation is seen)."""
    cfg = tiny_config()
    params = random_params(cfg)
    b, s, t = 2, 5, 6
    inputs, targets = random_tokens(0, (b, s)), random_tokens(1, (b, t))
    logits = np.asarray(forward(cfg, params, inputs, targets))
    for pos in range(t - 1):
        changed = targets.copy()
        changed[:, pos + 1 :] = (targets[:, pos + 1 :] - 2 + 1) % (V - 2) + 2  # new non-pad ids
        other = np.asarray(forward(cfg, params, inputs, changed))
        np.testing.assert_allclose(other[:, : pos + 1], logits[:, : pos + 1], atol=1e-5)
        if pos + 2 < t:  # position pos + 2 reads the changed target pos + 1
            assert np.abs(other[:, pos + 2 :] - logits[:, pos + 2 :]).max() > 1e-3, pos


def test_padding_does_not_change_real_positions_and_empty_rows_stay_finite():
    """Appending padding (id 0) to the source leaves the encoder output at real tokens and
    the logits at real targets unchanged; an all-padding source row gives finite values."""
    cfg = tiny_config()
    params = random_params(cfg)
    b, s, t, extra = 3, 5, 6, 3
    inputs = random_tokens(2, (b, s), lengths=[5, 3, 0])  # row 2: nothing but padding
    targets = random_tokens(3, (b, t), lengths=[6, 4, 2])
    padded = np.pad(inputs, ((0, 0), (0, extra)), constant_values=PAD_ID)
    encoded, logits = encode_and_forward(cfg, params, inputs, targets)
    encoded_padded, logits_padded = encode_and_forward(cfg, params, padded, targets)
    for x in (encoded, logits, encoded_padded, logits_padded):
        assert np.isfinite(np.asarray(x)).all()
    real_source, real_target = inputs != PAD_ID, targets != PAD_ID
    np.testing.assert_allclose(
        np.asarray(encoded_padded)[:, :s][real_source], np.asarray(encoded)[real_source], atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(logits_padded)[real_target], np.asarray(logits)[real_target], atol=1e-5
    )


def _param_names(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    params = random_params(cfg)
    return {'/'.join(k): v.shape for k, v in traverse_util.flatten_dict(params).items()}


@pytest.mark.parametrize(
    ('share', 'expected'),
    [
        ('all', {'shared_embedding/embedding': (V, D)}),
        ('target', {'source_embedding/embedding': (V, D), 'target_embedding/embedding': (V, D)}),
        (
            'none',
            {
                'source_embedding/embedding': (V, D),
                'target_embedding/embedding': (V, D),
                'logits_dense/kernel': (D, V),
            },
        ),
    ],
)
def test_embedding_parameters_per_sharing_mode(share, expected):
    """Each share_embeddings mode has exactly the expected embedding / pre-softmax params and
    no other parameter of shape [V, D] or [D, V]."""
    names = _param_names(tiny_config(share_embeddings=share))
    vocab_params = {k: v for k, v in names.items() if v in ((V, D), (D, V))}
    assert vocab_params == expected
    assert not any('embedding' in k or 'logits' in k for k in names.keys() - expected.keys())


@pytest.mark.parametrize('pre_layer_norm', [False, True])
def test_tied_logits_are_decoder_output_times_embedding_transpose(pre_layer_norm):
    """With share_embeddings='all', logits = y E^T for the decoder's final output y (the last
    layer's output for post-LN, the final LayerNorm's for pre-LN) and the shared E."""
    cfg = tiny_config(pre_layer_norm=pre_layer_norm, num_decoder_layers=2)
    params = random_params(cfg)
    inputs, targets = random_tokens(4, (2, 5), lengths=[5, 4]), random_tokens(5, (2, 6))
    last = 'decoder_norm' if pre_layer_norm else 'decoder_layer_1'
    logits, state = jax.jit(
        lambda p, x, y: Transformer(cfg).apply(
            {'params': p},
            x,
            y,
            capture_intermediates=lambda m, method: m.name == last and method == '__call__',
            mutable=['intermediates'],
        )
    )(params, inputs, targets)
    (y,) = state['intermediates'][last]['__call__']
    embedding = params['shared_embedding']['embedding']
    assert y.shape == (2, 6, D)
    np.testing.assert_allclose(logits, np.asarray(y) @ embedding.T, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_shared_embedding_gradient_is_sum_of_its_three_uses():
    """The gradient w.r.t. the one shared matrix E equals the sum of the gradients that the
    source embedding, the target embedding and the pre-softmax projection receive when each
    holds its own copy of E (share_embeddings='none', logits_dense/kernel = E^T)."""
    cfg_all = tiny_config(share_embeddings='all')
    cfg_none = tiny_config(share_embeddings='none')
    params_all = random_params(cfg_all)
    embedding = params_all['shared_embedding']['embedding']
    params_none = {k: v for k, v in params_all.items() if k != 'shared_embedding'}
    params_none |= {
        'source_embedding': {'embedding': embedding},
        'target_embedding': {'embedding': embedding},
        'logits_dense': {'kernel': embedding.T},
    }
    # Source and target ids overlap, so rows of E receive gradient from several uses.
    inputs, targets = random_tokens(6, (2, 5), lengths=[5, 3]), random_tokens(7, (2, 6))
    weights = np.random.default_rng(8).standard_normal((2, 6, V)).astype(np.float32)

    def loss(params, cfg):
        logits = Transformer(cfg).apply({'params': params}, inputs, targets)
        return jnp.sum(logits * weights)

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    loss_all, g_all = grad(params_all, cfg_all)
    loss_none, g_none = grad(params_none, cfg_none)
    np.testing.assert_allclose(loss_all, loss_none, rtol=1e-5)
    uses = [
        g_none['source_embedding']['embedding'],
        g_none['target_embedding']['embedding'],
        g_none['logits_dense']['kernel'].T,
    ]
    for g in uses:
        assert np.abs(g).max() > 1e-2  # each use contributes, so dropping one would fail
    np.testing.assert_allclose(
        g_all['shared_embedding']['embedding'], sum(uses), rtol=1e-4, atol=1e-5
    )
    # Every other parameter sees the same gradient in both models.
    for name in params_none:
        if name in params_all:
            for a, b in zip(
                jax.tree_util.tree_leaves(g_all[name]),
                jax.tree_util.tree_leaves(g_none[name]),
                strict=True,
            ):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# The parts of a later Transformer (rotary positions, RMSNorm, SwiGLU, QK-norm, grouped keys
# and values), each a model.* field: tests/model/test_later_parts.py.
MODERN = {
    'positions': 'rope',
    'norm': 'rms_norm',
    'ffn': 'swiglu',
    'qk_norm': True,
    'num_kv_heads': 2,
    'pre_layer_norm': True,
}


@pytest.mark.slow
@pytest.mark.parametrize('overrides', [{}, MODERN], ids=['paper', 'modern'])
def test_packed_row_equals_examples_run_separately(overrides):
    """Two examples packed into one row (segment ids 1, 1, ..., 2, 2, 0 and positions
    restarting at 0) give the same logits at their real targets as the two examples run
    alone; without the segmentation the second example would see the first."""
    cfg = tiny_config(num_decoder_layers=2, **overrides)
    params = random_params(cfg)
    s, t = 7, 8
    src_a, tgt_a = random_tokens(9, (1, 3))[0], random_tokens(10, (1, 4))[0]
    src_b, tgt_b = random_tokens(11, (1, 2))[0], random_tokens(12, (1, 2))[0]

    def pad(x, n):
        return np.pad(x, (0, n - len(x)))

    def segments(*lengths, n):
        return pad(np.concatenate([np.full(k, i + 1) for i, k in enumerate(lengths)]), n)

    def positions(*lengths, n):
        return pad(np.concatenate([np.arange(k) for k in lengths]), n)

    # Row 0 packs (a, b), row 1 packs (b, a); the unpacked batch holds a and b alone.
    packed_inputs = np.stack([pad(np.r_[src_a, src_b], s), pad(np.r_[src_b, src_a], s)])
    packed_targets = np.stack([pad(np.r_[tgt_a, tgt_b], t), pad(np.r_[tgt_b, tgt_a], t)])
    packing = {
        'inputs_segmentation': np.stack([segments(3, 2, n=s), segments(2, 3, n=s)]),
        'targets_segmentation': np.stack([segments(4, 2, n=t), segments(2, 4, n=t)]),
        'inputs_positions': np.stack([positions(3, 2, n=s), positions(2, 3, n=s)]),
        'targets_positions': np.stack([positions(4, 2, n=t), positions(2, 4, n=t)]),
    }
    packing = {k: v.astype(np.int32) for k, v in packing.items()}
    packed = np.asarray(forward(cfg, params, packed_inputs, packed_targets, packing))
    alone = np.asarray(
        forward(
            cfg,
            params,
            np.stack([pad(src_a, s), pad(src_b, s)]),
            np.stack([pad(tgt_a, t), pad(tgt_b, t)]),
        )
    )
    a, b = alone[0, :4], alone[1, :2]
    np.testing.assert_allclose(packed[0, :4], a, atol=1e-5)
    np.testing.assert_allclose(packed[0, 4:6], b, atol=1e-5)
    np.testing.assert_allclose(packed[1, :2], b, atol=1e-5)
    np.testing.assert_allclose(packed[1, 2:6], a, atol=1e-5)

    # The segmentation is what isolates the examples: with every real token in one segment
    # (positions kept), the second example's logits change.
    merged = dict(packing)
    for key in ('inputs_segmentation', 'targets_segmentation'):
        merged[key] = (merged[key] > 0).astype(np.int32)
    leaky = np.asarray(forward(cfg, params, packed_inputs, packed_targets, merged))
    assert np.abs(leaky[0, 4:6] - b).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(
    'overrides, dtype, atol',
    [
        ({}, 'float32', 1e-5),
        ({'pre_layer_norm': True}, 'float32', 1e-5),
        pytest.param({}, 'bfloat16', 4, marks=pytest.mark.long),
        (MODERN, 'float32', 1e-5),
        pytest.param(
            {**MODERN, 'ffn': 'geglu', 'pre_layer_norm': False},
            'float32',
            1e-5,
            marks=pytest.mark.long,
        ),
    ],
    ids=['post_ln', 'pre_ln', 'bfloat16', 'modern', 'modern_geglu_post_ln'],
)
def test_cached_decoding_equals_full_forward(overrides, dtype, atol):
    """Decoding one position at a time with the key/value cache (feeding 0, then the previous
    target) reproduces the teacher-forced logits at every real target position. The steps
    are given an all-NaN encoder output, which any use would spread to the logits: they read
    its keys and values only from the cache that `init_cache` filled. In bfloat16 (the CPU's
    16-bit products of transformer/backends/products.py, one-row products included; a GPU's
    fused kernels) the two agree to bfloat16 rounding: ``atol`` bfloat16 steps at the logits'
    largest magnitude (an H100 showed 3). In the long tier: the bfloat16 case, a second dtype
    of the same steps (the float32 cases decode them; tests/backends/test_products.py checks
    the bfloat16 products), and the modern parts with GeGLU after each sub-layer (post-LN):
    the modern case decodes their norms, rotations and grouped heads, the post-LN case that
    placement, and a feed-forward reads no cache."""
    cfg = tiny_config(num_decoder_layers=2, dtype=dtype, **overrides)
    model = Transformer(cfg)
    params = random_params(cfg)
    b, s, t = 2, 5, 6
    inputs = random_tokens(13, (b, s), lengths=[5, 3])
    targets = random_tokens(14, (b, t), lengths=[6, 4])
    encoded, full = encode_and_forward(cfg, params, inputs, targets)

    @jax.jit
    def step(cache, token):
        return model.apply(
            {'params': params, 'cache': cache},
            jnp.full_like(encoded, jnp.nan),
            inputs,
            token,
            decode=True,
            method=Transformer.decode,
            mutable=['cache'],
        )

    cache = jax.jit(init_cache, static_argnums=(0, 4))(model, params, encoded, inputs, t)
    previous = np.zeros((b, 1), np.int32)
    stepwise = []
    for pos in range(t):
        logits, state = step(cache, previous)
        cache = state['cache']
        assert logits.shape == (b, 1, V)
        stepwise.append(np.asarray(logits[:, 0]))
        previous = targets[:, pos : pos + 1]
    stepwise = np.stack(stepwise, axis=1)
    real = targets != PAD_ID
    if dtype == 'bfloat16':  # one step of bfloat16's 8 significant bits at that magnitude
        ulp = 2.0 ** (np.floor(np.log2(np.abs(np.asarray(full, np.float32)).max())) - 7)
        atol = atol * ulp
    np.testing.assert_allclose(stepwise[real], np.asarray(full)[real], atol=atol)


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _self_attention(x, p, mask):
    q, k, v = (
        np.einsum('btd,dnh->btnh', x, p[name]['kernel']) for name in ('query', 'key', 'value')
    )
    logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum('bnts,bsnh,nhd->btd', probs, v, p['out']['kernel'])


def _ffn(x, p):
    hidden = np.maximum(0.0, x @ p['wi']['kernel'] + p['wi']['bias'])
    return hidden @ p['wo']['kernel'] + p['wo']['bias']


@pytest.mark.parametrize('pre_layer_norm', [False, True])
def test_encoder_layer_wiring_is_post_ln_or_pre_ln(pre_layer_norm):
    """An encoder layer is LayerNorm(x + Sublayer(x)) around self-attention then the ReLU FFN
    (post-LN, Sec. 3.1), or x + Sublayer(LayerNorm(x)) with pre_layer_norm; checked against a
    float64 numpy re-implementation with a key-padding mask."""
    cfg = tiny_config(pre_layer_norm=pre_layer_norm)
    b, s = 2, 5
    x = np.random.default_rng(17).standard_normal((b, s, D)).astype(np.float32)
    mask = (np.arange(s) < np.array([[5], [3]]))[:, None, None, :]  # [B, 1, 1, S] key padding
    layer = EncoderLayer(cfg)
    shapes = nn.unbox(
        jax.eval_shape(
            lambda: layer.init(jax.random.key(0), LayerFlags(), x, AttentionInputs(mask))
        )['params']
    )
    params = fill_random(shapes, seed=18)
    y = jax.jit(lambda p: layer.apply({'params': p}, LayerFlags(), x, AttentionInputs(mask)))(
        params
    )

    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    eps = cfg.layer_norm_epsilon
    h = x.astype(np.float64)
    for name, sublayer in (
        ('self_attention', lambda z: _self_attention(z, p['self_attention'], mask)),
        ('ffn', lambda z: _ffn(z, p['ffn'])),
    ):
        norm = p[f'{name}_norm']
        if pre_layer_norm:
            h = h + sublayer(_layer_norm(h, norm, eps))
        else:
            h = _layer_norm(h + sublayer(h), norm, eps)
    np.testing.assert_allclose(y, h, atol=1e-5)


def test_base_model_parameter_count_matches_paper():
    """The paper's base model (V = 37000 shared BPE) has the parameter count that its
    variants declare (model/variants.py) and is within 5% of the paper's ~65M (Table 3)."""
    cfg = TransformerConfig(vocab_size=37000)
    tokens = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(Transformer(cfg).init, jax.random.key(0), tokens, tokens)
    count = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes['params']))
    expected = param_count(cfg)
    assert count == expected, f'base model has {count:,} parameters, its variants {expected:,}'
    assert abs(count - 65e6) / 65e6 < 0.05, f'base model has {count:,} parameters, paper ~65M'


def test_sinusoidal_positions_match_paper_formula():
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D))."""
    d = 16
    positions = np.array([[0, 1, 5], [37, 100, 255]])
    pe = np.asarray(sinusoidal_positions(jnp.asarray(positions), d))
    assert pe.shape == (2, 3, d)
    for index in np.ndindex(positions.shape):
        pos, row = int(positions[index]), pe[index]
        for i in (0, 1, 3, d // 2 - 1):
            angle = pos / 10000 ** (2 * i / d)
            assert row[2 * i] == pytest.approx(math.sin(angle), abs=1e-4), (pos, i)
            assert row[2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-4), (pos, i)


@pytest.mark.slow
def test_dropout_only_when_not_deterministic():
    """Two dropout rngs give different logits with deterministic=False and identical ones
    (equal to a call with no rng at all) with deterministic=True."""
    cfg = tiny_config(dropout_rate=0.1, attention_dropout_rate=0.1, relu_dropout_rate=0.1)
    model = Transformer(cfg)
    params = random_params(cfg)
    inputs, targets = random_tokens(15, (2, 5)), random_tokens(16, (2, 6))

    @functools.partial(jax.jit, static_argnames='deterministic')
    def run(p, rng, deterministic):
        return model.apply(
            {'params': p}, inputs, targets, deterministic=deterministic, rngs={'dropout': rng}
        )

    # rbg keys: the property does not depend on the PRNG, and threefry dropout masks take
    # several seconds to compile on CPU.
    key_1, key_2 = jax.random.key(1, impl='rbg'), jax.random.key(2, impl='rbg')
    train_1, train_2 = (np.asarray(run(params, key, False)) for key in (key_1, key_2))
    assert np.abs(train_1 - train_2).max() > 1e-3
    np.testing.assert_array_equal(run(params, key_1, False), train_1)  # same rng, same mask
    eval_1, eval_2 = (np.asarray(run(params, key, True)) for key in (key_1, key_2))
    np.testing.assert_array_equal(eval_1, eval_2)
    np.testing.assert_allclose(eval_1, forward(cfg, params, inputs, targets), atol=1e-5)
    assert np.abs(train_1 - eval_1).max() > 1e-3


def test_config_from_dict_rejects_unknown_keys_and_maps_dtypes():
    """Unknown keys fail naming the key and the nearest valid one; dtype names map to jnp
    dtypes."""
    with pytest.raises(ValueError, match=r'key model.d_modle; did you mean model.d_model\?'):
        config_from_dict({'d_modle': 64}, vocab_size=V)
    with pytest.raises(ValueError, match="model.dtype='float64' must be one of 'float32'"):
        config_from_dict({'dtype': 'float64'}, vocab_size=V)
    cfg = config_from_dict({'d_model': 64, 'dtype': 'bfloat16'}, vocab_size=V)
    assert (cfg.vocab_size, cfg.d_model, cfg.dtype, cfg.num_heads) == (V, 64, jnp.bfloat16, 8)


@pytest.mark.slow
def test_fused_attention_equals_einsum_packed_padded_and_cached():
    """model.attention_impl='fused' gives the 'einsum' logits to 1e-5 on packed rows (segment
    masks, restarting positions), on padded rows (causal decoder, padding masks) and when
    decoding one position at a time through the key/value cache."""
    einsum, fused = (
        tiny_config(num_decoder_layers=2),
        tiny_config(num_decoder_layers=2, attention_impl='fused'),
    )
    params = random_params(einsum)
    inputs = random_tokens(13, (2, 7), lengths=[7, 4])
    targets = random_tokens(14, (2, 8), lengths=[8, 3])
    packing = {
        'inputs_segmentation': np.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 2, 2, 2]]),
        'targets_segmentation': np.array([[1, 1, 1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 2, 2, 0, 0]]),
        'inputs_positions': np.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 0, 1, 2, 3, 4]]),
        'targets_positions': np.array([[0, 1, 2, 3, 0, 1, 0, 0], [0, 1, 0, 1, 2, 3, 0, 0]]),
    }
    packing = {k: v.astype(np.int32) for k, v in packing.items()}
    packed_inputs = np.where(packing['inputs_segmentation'] > 0, np.abs(inputs) + 2, PAD_ID)
    packed_targets = np.where(packing['targets_segmentation'] > 0, np.abs(targets) + 2, PAD_ID)
    for args in ((inputs, targets, None), (packed_inputs, packed_targets, packing)):
        expected = np.asarray(forward(einsum, params, *args))
        real = args[1] != PAD_ID
        np.testing.assert_allclose(
            np.asarray(forward(fused, params, *args))[real], expected[real], atol=1e-5
        )

    def stepwise(cfg):
        model = Transformer(cfg)
        encoded = jax.jit(encode, static_argnums=0)(model, params, inputs)  # no decoder pass
        cache = jax.jit(init_cache, static_argnums=(0, 4))(
            model, params, encoded, inputs, targets.shape[1]
        )

        @jax.jit  # one compiled step instead of every op dispatched eagerly at every position
        def step(cache, previous):
            return model.apply(
                {'params': params, 'cache': cache},
                encoded,
                inputs,
                previous,
                decode=True,
                method=Transformer.decode,
                mutable=['cache'],
            )

        previous, out = np.zeros((2, 1), np.int32), []
        for pos in range(targets.shape[1]):
            logits, state = step(cache, previous)
            cache = state['cache']
            out.append(np.asarray(logits[:, 0]))
            previous = targets[:, pos : pos + 1]
        return np.stack(out, axis=1)

    np.testing.assert_allclose(stepwise(fused), stepwise(einsum), atol=1e-5)
