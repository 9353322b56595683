"""The parts of a later Transformer, each a registered entry or a declared setting: rotary
positions (model.positions='rope'), RMSNorm (model.norm='rms_norm'), the gated feed-forwards
(model.ffn='swiglu', 'geglu'), QK-norm (model.qk_norm) and the z-loss (train.z_loss); each
against a computation written here, and their bad values. Cached decoding and packed rows of
the modern model: tests/model/test_model.py (MODERN)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.model.test_model import MODERN, forward, random_params, random_tokens, tiny_config
from transformer import schema
from transformer.fields import ConfigError
from transformer.model import Packing, Transformer, param_count, sinusoidal_positions, variants
from transformer.model import positions as positions_lib
from transformer.model.attention import MultiHeadAttention
from transformer.model.masks import AttentionInputs
from transformer.training import fused_cross_entropy
from transformer.training.loss import position_losses

ROPE = variants.chosen(tiny_config(positions='rope'), 'positions').module


def _rope_reference(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x [B, T, N, H] turned pair by pair, (j, j + H/2) by position * 10000^(-2j/H)."""
    h = x.shape[-1]
    out = np.empty_like(x, dtype=np.float64)
    for j in range(h // 2):
        angle = positions[:, :, None] * 10000.0 ** (-2 * j / h)
        a, b = x[..., j], x[..., j + h // 2]
        out[..., j] = a * np.cos(angle) - b * np.sin(angle)
        out[..., j + h // 2] = b * np.cos(angle) + a * np.sin(angle)
    return out


def test_rotation_is_the_written_one_and_logits_depend_only_on_offsets():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 2, 5, 3, 8)).astype(np.float32)
    positions = np.stack([np.arange(5), np.array([0, 1, 2, 0, 1])])
    rq, rk = (np.asarray(x) for x in ROPE.rotate(q, k, jnp.asarray(positions)))
    np.testing.assert_allclose(rq, _rope_reference(q, positions), atol=1e-5)
    logits = np.einsum('btnh,bsnh->bnts', rq, rk)
    shifted = [np.asarray(x) for x in ROPE.rotate(q, k, jnp.asarray(positions + 37))]
    np.testing.assert_allclose(np.einsum('btnh,bsnh->bnts', *shifted), logits, atol=1e-4)
    # Not a constant rotation: moving the keys alone changes the logits.
    moved = np.asarray(ROPE.rotate(q, k, jnp.asarray(positions + 3))[1])
    assert np.abs(np.einsum('btnh,bsnh->bnts', rq, moved) - logits).max() > 1e-2
    assert ROPE.rotate(q, k, None) == (q, k)  # cross-attention: not rotated


def test_attention_with_rotary_positions_is_shift_invariant_and_cross_attention_unrotated():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 6, 16)), jnp.float32)
    module = MultiHeadAttention(num_heads=2, position_encoding=ROPE)
    params = module.init(jax.random.key(0), x)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))

    def attend(p, kv=None):
        return np.asarray(module.apply(params, x, kv, AttentionInputs(None, p)))

    np.testing.assert_allclose(attend(positions + 11), attend(positions), atol=1e-5)
    assert np.abs(attend(positions) - attend(None)).max() > 1e-3  # rotated at all
    np.testing.assert_allclose(attend(None, x), attend(positions, x), atol=0)  # kv given


def test_the_sinusoid_is_added_only_by_the_sinusoidal_encoding():
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 4, 8)), jnp.float32)
    positions = jnp.arange(4)[None]
    assert ROPE.embed(x, positions) is x
    sinusoidal = variants.chosen(tiny_config(), 'positions').module
    expected = x + sinusoidal_positions(positions, 8)
    np.testing.assert_allclose(sinusoidal.embed(x, positions), expected, atol=0)


def test_packed_rows_rotate_by_each_segments_own_positions(monkeypatch):
    """Rotations see only offsets, so packed == unpacked cannot tell whether the packing's
    positions reached them: the positions each self-attention rotates by are recorded."""
    seen = []
    rotate = positions_lib.PositionEncoding.rotate

    def recording(self, q, k, positions):
        if positions is not None:
            seen.append(np.asarray(positions))
        return rotate(self, q, k, positions)

    cfg = tiny_config(positions='rope')
    params = random_params(cfg)
    monkeypatch.setattr(positions_lib.PositionEncoding, 'rotate', recording)
    inputs = random_tokens(3, (1, 6))
    within = np.array([[0, 1, 2, 0, 1, 2]], np.int32)
    segments = np.array([[1, 1, 1, 2, 2, 2]], np.int32)
    packing = Packing(segments, segments, within, within)
    Transformer(cfg).apply({'params': params}, inputs, inputs, packing=packing)
    assert len(seen) == 2  # the encoder's and the decoder's self-attention
    for positions in seen:
        np.testing.assert_array_equal(positions, within)


def test_rms_norm_gated_ffns_and_qk_norm_are_the_written_computations():
    cfg = tiny_config(norm='rms_norm', ffn='swiglu', qk_norm=True, layer_norm_epsilon=1e-5)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 32)).astype(np.float32)
    norm = variants.chosen(cfg, 'norm').module(cfg, name='n')
    scale = rng.standard_normal(32).astype(np.float32)
    y = norm.apply({'params': {'scale': scale}}, x)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)

    gelu = lambda z: 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))  # noqa: E731
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    # GELU's tanh approximation, Hugging Face's "gelu_new" (T5 v1.1's gate).
    tanh_gelu = lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))  # noqa: E731
    for name, act in (('swiglu', silu), ('geglu', gelu), ('geglu_tanh', tanh_gelu)):
        gated = tiny_config(ffn=name)
        module = variants.chosen(gated, 'ffn').module(gated)
        init = lambda m=module: m.init(jax.random.key(0), x, True)  # noqa: E731
        shapes = nn.unbox(jax.eval_shape(init)['params'])
        assert set(shapes) == {'wi_0', 'wi_1', 'wo'}  # three matrices, no biases
        p = {k: {'kernel': rng.standard_normal(v['kernel'].shape) / 8} for k, v in shapes.items()}
        with jax.default_matmul_precision('float32'):
            out = module.apply({'params': p}, x, True)
        x64 = x.astype(np.float64)
        hidden = act(x64 @ p['wi_0']['kernel']) * (x64 @ p['wi_1']['kernel'])
        np.testing.assert_allclose(out, hidden @ p['wo']['kernel'], rtol=1e-4, atol=1e-5)

    # QK-norm: each head's queries and keys RMS-normed over H, scaled per channel.
    module = MultiHeadAttention(num_heads=4, qk_norm=True, norm_epsilon=1e-5)
    params = nn.unbox(module.init(jax.random.key(1), x)['params'])
    assert params['query_norm']['scale'].shape == params['key_norm']['scale'].shape == (8,)
    params = jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape), a.dtype), params)
    probs = module.apply({'params': params}, x, mutable='intermediates')[1]
    probs = np.asarray(probs['intermediates']['attention_weights'][0])

    def normed(name):
        h = np.einsum('btd,dnh->btnh', x, params[name]['kernel'])
        h = h / np.sqrt((h.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
        return h * params[f'{name}_norm']['scale']

    logits = np.einsum('btnh,bsnh->bnts', normed('query'), normed('key')) / math.sqrt(8)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probs, expected / expected.sum(-1, keepdims=True), atol=1e-5)


def test_gated_ffns_hold_one_and_a_half_times_the_ffn_matrices():
    plain, gated = tiny_config(), tiny_config(ffn='swiglu')
    layers = plain.num_encoder_layers + plain.num_decoder_layers
    matrices = 2 * 32 * 64 + 64 + 32  # the ReLU FFN's two matrices and biases
    assert param_count(gated) - param_count(plain) == layers * (3 * 32 * 64 - matrices)


@pytest.mark.parametrize('chunked', [False, True], ids=['per_position', 'chunked'])
def test_z_loss_gradient_is_the_formulas_in_both_loss_paths(chunked):
    """d/dz C log(Z)^2 = 2 C log(Z) softmax(z), beside the smoothed loss's softmax(z) - q."""
    c, smoothing = 0.3, 0.1
    rng = np.random.default_rng(5)
    hidden = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.float32)
    weight = jnp.asarray(rng.standard_normal((11, 8)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 11, (2, 3)), jnp.int32)
    weights = jnp.asarray([[1, 1, 1], [1, 1, 0]], jnp.float32)

    def ours(w):
        if chunked:
            total, _, _, z = fused_cross_entropy(
                hidden, w, None, targets, weights, smoothing, 2, jnp.float32, z_loss=c
            )
            return total, z
        logits = jnp.einsum('btd,vd->btv', hidden, w, precision='highest')
        smoothed, _, z = position_losses(logits, targets, smoothing, c)
        return ((smoothed + z) * weights).sum(), (z * weights).sum()

    def formula(w):
        logits = jnp.einsum('btd,vd->btv', hidden, w, precision='highest')
        lse = jax.nn.logsumexp(logits, axis=-1)
        low = smoothing / 10
        q = jax.nn.one_hot(targets, 11) * (1 - smoothing - low) + low
        smoothed = -(q * jax.nn.log_softmax(logits)).sum(-1)
        z = c * lse**2
        return ((smoothed + z) * weights).sum(), (z * weights).sum()

    # Compiled: one compilation each costs less than running the chunked path op by op.
    (value, z), grad = jax.jit(jax.value_and_grad(ours, has_aux=True))(weight)
    (expected, expected_z), expected_grad = jax.jit(jax.value_and_grad(formula, has_aux=True))(
        weight
    )
    np.testing.assert_allclose([value, z], [expected, expected_z], rtol=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert float(z) > 0.01 * float(value)  # the term is there to be seen


def test_z_loss_is_reported_beside_the_loss_and_added_to_the_objective():
    from transformer.training import steps

    cfg = tiny_config()
    params = random_params(cfg)
    batch = {'inputs': random_tokens(6, (2, 5)), 'targets': random_tokens(7, (2, 4))}
    model = Transformer(cfg)
    # Compiled: three compilations cost less than running the losses op by op.
    loss_sums = jax.jit(steps.loss_sums, static_argnums=(2, 3, 5), static_argnames='z_loss')
    plain, plain_sums = loss_sums(params, batch, model, 0.1, None)
    for chunk in (0, 3):
        total, sums = loss_sums(params, batch, model, 0.1, None, chunk, z_loss=0.01)
        np.testing.assert_allclose(sums['loss'], plain_sums['loss'], rtol=1e-5)
        np.testing.assert_allclose(total, plain + sums['z_loss'], rtol=1e-5)
        assert float(sums['z_loss']) > 0
        summary = steps.summarize(sums, cfg.vocab_size, 0.1)
        np.testing.assert_allclose(summary['z_loss'], sums['z_loss'] / sums['tokens'], rtol=1e-6)
    assert 'z_loss' not in plain_sums


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'positions': 'alibi'}, "model.positions='alibi' must be one of 'sinusoidal', 'rope'"),
        ({'norm': 'scale_norm'}, "model.norm='scale_norm' must be one of 'layer_norm', 'rms_norm'"),
        (
            {'positions': 'rope', 'd_model': 12, 'num_heads': 4},
            "model.positions='rope' turns pairs of a head's channels, so the head size must be "
            'even, not 3',
        ),
        ({'positions': 'rope', 'head_dim': 5}, 'the head size must be even, not 5'),
        ({'d_model': 33, 'num_heads': 3}, 'model.d_model=33 must be even for sinusoidal'),
    ],
)
def test_bad_parts_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        tiny_config(**overrides)
    assert message in str(info.value) and '\n' not in str(info.value)


def test_a_negative_z_loss_is_a_one_line_error():
    from tests.tiny_run import tiny_run_config

    config = tiny_run_config(1)
    config.train.z_loss = -0.1
    with pytest.raises(ConfigError, match=r'train\.z_loss=-0\.1') as info:
        schema.parse(config)
    assert '\n' not in str(info.value)


def test_the_modern_variant_trains_its_loss_down():
    """A few Adam steps on one batch lower the modern model's loss: every part has a
    gradient that reaches its parameters."""
    import optax

    cfg = tiny_config(**MODERN)
    params = random_params(cfg)
    inputs, targets = random_tokens(8, (4, 6)), random_tokens(9, (4, 5))
    tx = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state):
        def loss(p):
            logits = forward(cfg, p, inputs, targets)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, value, grads

    opt_state = tx.init(params)
    params, opt_state, first, grads = step(params, opt_state)
    for name in ('query_norm', 'key_norm'):
        assert np.abs(grads['encoder_layer_0']['self_attention'][name]['scale']).max() > 0
    for _ in range(20):
        params, opt_state, last, _ = step(params, opt_state)
    assert float(last) < 0.5 * float(first)


@pytest.mark.parametrize(
    'model, line',
    [
        (
            {'positions': 'rope'},
            "model.positions='rope' cannot be exported as --format=hf: MarianMT adds sinusoids",
        ),
        ({'norm': 'rms_norm'}, "model.norm='rms_norm' cannot be exported as --format=hf"),
        ({'ffn': 'geglu'}, "model.ffn='geglu' cannot be exported as --format=hf"),
        ({'qk_norm': True}, 'model.qk_norm=True cannot be exported as --format=hf: MarianMT has'),
    ],
)
def test_the_marian_export_refuses_each_part_in_one_line_and_writes_nothing(
    tmp_path, monkeypatch, model, line
):
    import importlib.util

    from tests.tiny_run import run_dir_with
    from transformer.commands import export

    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
    workdir, _ = run_dir_with(tmp_path, **model)
    with pytest.raises(export.ExportError) as info:
        export.export(str(workdir), str(tmp_path / 'out'), format='hf')
    assert str(info.value).startswith(line) and '\n' not in str(info.value)
    assert not (tmp_path / 'out').exists()
    # CTranslate2 holds it (QK-norm with one head only): on to the package check (the extra
    # is missing here).
    ct2 = 'CTranslate2 norms the cross-attention queries' if 'qk_norm' in model else 'needs the'
    with pytest.raises(export.ExportError, match=ct2):
        export.export(str(workdir), str(tmp_path / 'out'), format='ctranslate2')
