"""transformer/model/dot_product.py: `attend`, the one scaled dot-product attention every path
computes, takes a scale on the logits (``model.attention_scale``) and an additive logits bias
[B or 1, N, T, S]; the einsum path, the fused path, Pallas's segment-id kernel, the decoding
step over the cache and packed rows all give the same heads with both, in float32."""

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.model import test_masks
from tests.random_params import fill_random
from transformer import fields, interop
from transformer.backends import segment_attention
from transformer.commands import ctranslate2_spec
from transformer.interop.fairseq_config import FAIRSEQ_IDS, SPECS
from transformer.interop.t5 import model_settings as t5_model_settings
from transformer.model import TransformerConfig, export_refusal, settings
from transformer.model.attention import MultiHeadAttention
from transformer.model.dot_product import attend, logits_scale, pallas_refusal
from transformer.model.masks import AttentionInputs, AttentionMask

B, T, N, K, H, D = 3, 6, 4, 2, 8, 16
SCALE = 0.3


def _normal(seed: int, shape) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _reference(q, k, v, mask, bias, factor) -> np.ndarray:
    """softmax(factor * q k^T + bias) v in float64 numpy, query head i reading key head
    i // (N / K); masked keys dropped, a query with no key gives zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    logits = factor * np.einsum('btnh,bsnh->bnts', q, k) + np.asarray(bias, np.float64)
    mask = np.broadcast_to(np.asarray(mask.dense()), logits.shape)
    logits = np.where(mask, logits, -np.inf)
    top = np.max(np.where(mask, logits, -1e300), axis=-1, keepdims=True)
    weights = np.where(mask, np.exp(logits - top), 0.0)
    total = weights.sum(-1, keepdims=True)
    probs = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return np.einsum('bnts,bsnh->btnh', probs, v)


def _inputs(name: str):
    t, s, mask = test_masks._case(name)
    q, k, v = _normal(0, (B, t, N, H)), _normal(1, (B, s, K, H)), _normal(2, (B, s, K, H))
    return q, k, v, mask, _normal(3, (1, N, t, s))


@pytest.mark.parametrize('name', test_masks.CASES)
def test_the_einsum_and_fused_paths_take_the_bias_and_the_scale(name):
    """Padded, causal and packed masks, grouped heads, a random bias and scale 0.3: the einsum
    and the fused path equal a float64 reference to 1e-5; so does each without the bias."""
    q, k, v, mask, bias = _inputs(name)
    expected = _reference(q, k, v, mask, bias, SCALE)
    for impl in ('einsum', 'fused'):
        out = attend(q, k, v, mask=mask, bias=bias, scale=SCALE, impl=impl)
        np.testing.assert_allclose(out, expected, atol=1e-5, err_msg=impl)
        plain = attend(q, k, v, mask=mask, scale=SCALE, impl=impl)
        np.testing.assert_allclose(plain, _reference(q, k, v, mask, 0.0, SCALE), atol=1e-5)
    assert np.abs(expected - _reference(q, k, v, mask, 0.0, SCALE)).max() > 0.1


def test_a_scale_of_one_multiplies_the_default_logits_by_sqrt_h():
    """scale=1.0 (T5's) gives softmax(q k^T) where the default gives softmax(q k^T / sqrt(H)):
    each matches the float64 reference of its factor to 1e-5 and the two differ; the
    default's factor is 1/sqrt(H) exactly as jax's own."""
    q, k, v, mask, bias = _inputs('encoder self-attention, padded')
    probs = {}
    for scale in (None, 1.0):
        factor = 1.0 if scale else H**-0.5
        keep = lambda p, s=scale: probs.setdefault(s, p)  # noqa: E731
        out = attend(q, k, v, mask=mask, bias=bias, scale=scale, on_probs=keep)
        np.testing.assert_allclose(out, _reference(q, k, v, mask, bias, factor), atol=1e-5)
    assert logits_scale(H, None) == float(H) ** -0.5 and logits_scale(H, 1.0) == 1.0
    # Where every key is allowed, log p + log Z is the logits: the bias-free parts differ by
    # sqrt(H) exactly (up to float32 rounding).
    row = np.asarray(mask.dense())[0, 0, 0]
    logs = {s: np.log(np.asarray(p, np.float64)[0, :, 0][:, row]) for s, p in probs.items()}
    raw = {s: logs[s] - np.asarray(bias, np.float64)[0, :, 0][:, row] for s in logs}
    centred = {s: r - r.mean(-1, keepdims=True) for s, r in raw.items()}
    np.testing.assert_allclose(centred[1.0], np.sqrt(H) * centred[None], rtol=1e-5, atol=1e-5)


def test_pallas_takes_the_scale_and_refuses_a_bias_in_one_line(monkeypatch, caplog):
    """Packed self-attention by Pallas's kernel (its interpreter here) with scale 0.3 equals the
    reference; with a bias it is refused in one logged line and the fused path computes it."""
    monkeypatch.setattr(segment_attention, 'INTERPRET', True)
    q, k, v, mask, bias = _inputs('decoder self-attention, packed, causal')
    pallas = dict(scale=SCALE, impl='pallas', packed_self_attention=True)
    out = attend(q, k, v, mask=mask, **pallas)
    assert 'pallas_call' in str(jax.make_jaxpr(lambda q: attend(q, k, v, mask=mask, **pallas))(q))
    np.testing.assert_allclose(out, _reference(q, k, v, mask, 0.0, SCALE), atol=1e-5)
    with caplog.at_level(logging.WARNING):
        biased = attend(q, k, v, mask=mask, bias=bias, **pallas)
    assert caplog.messages == [pallas_refusal(bias)]
    assert '\n' not in caplog.messages[0] and 'takes no logits bias' in caplog.messages[0]
    assert pallas_refusal(None) is None
    np.testing.assert_allclose(biased, _reference(q, k, v, mask, bias, SCALE), atol=1e-5)


def _module(scale, impl='einsum'):
    return MultiHeadAttention(num_heads=N, num_kv_heads=K, scale=scale, attention_impl=impl)


def _params(module, *inputs, seed=4):
    """Random values (tests/random_params.py) on the module's parameter tree: compiling its
    initialisers and drawing with jax, op by op, cost seconds."""
    shapes = jax.eval_shape(module.init, jax.random.key(0), *inputs)['params']
    return fill_random(nn.unbox(shapes), seed)


@pytest.mark.slow
def test_cached_decoding_with_a_bias_equals_the_full_forward():
    """Decoder self-attention with a [1, N, T, T] bias and scale 0.3, one position per call over
    the cache (each step given its bias row over the whole cache), equals the full forward of
    the einsum and the fused path; the bias changes the output."""
    x = _normal(6, (2, T, D))
    valid = jnp.ones((2, T), bool)
    causal = AttentionMask(valid, valid, causal=True)
    bias = _normal(7, (1, N, T, T))
    module = _module(SCALE)
    params = _params(module, x)
    # Compiled: op by op, every operation of each call is compiled on its own.
    apply, fused = jax.jit(module.apply), jax.jit(_module(SCALE, 'fused').apply)
    full = apply({'params': params}, x, None, AttentionInputs(causal, bias=bias))
    fused = fused({'params': params}, x, None, AttentionInputs(causal, bias=bias))
    np.testing.assert_allclose(fused, full, atol=1e-5)
    step = jax.jit(functools.partial(module.apply, decode=True, mutable=['cache']))
    _, made = step({'params': params}, x, None, AttentionInputs())  # as init: sizes the cache
    cache = made['cache']
    steps = []
    for t in range(T):
        inputs = AttentionInputs(bias=bias[:, :, t : t + 1])
        y, made = step({'params': params, 'cache': cache}, x[:, t : t + 1], None, inputs)
        cache = made['cache']
        steps.append(y)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)
    unbiased = apply({'params': params}, x, None, AttentionInputs(causal))
    assert np.abs(np.asarray(unbiased - full)).max() > 1e-2


def test_cross_attention_decoding_step_takes_the_bias():
    """A decoding step over the static encoder cache with a bias [B, N, 1, S] equals the full
    cross-attention of that query with the same bias."""
    s = 5
    x_kv, x_q = _normal(8, (2, s, D)), _normal(9, (2, 1, D))
    bias = _normal(10, (2, N, 1, s))
    module = _module(SCALE)
    params = _params(module, x_q, x_kv)
    # Compiled: op by op, every operation of each call is compiled on its own.
    expected = jax.jit(module.apply)({'params': params}, x_q, x_kv, AttentionInputs(bias=bias))
    decode = functools.partial(module.apply, decode=True, static_kv=True)
    _, made = jax.jit(functools.partial(decode, mutable=['cache']))({'params': params}, x_q, x_kv)
    step = jax.jit(decode)(
        {'params': params, 'cache': made['cache']}, x_q, x_kv, AttentionInputs(bias=bias)
    )
    np.testing.assert_allclose(step, expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('impl', ['einsum', 'fused'])
def test_packed_rows_with_a_bias_equal_the_examples_alone(impl):
    """Two examples packed in one row, the bias each example's block of a [1, N, 7, 7] bias:
    the packed output equals each example's own (its bias block), with scale 0.3."""
    x = _normal(11, (1, 7, D))
    bias = _normal(12, (1, N, 7, 7))
    segments = jnp.asarray([[1, 1, 1, 2, 2, 2, 2]])
    packed = AttentionMask(segments > 0, segments > 0, segments, segments, causal=True)
    module = _module(SCALE, impl)
    params = _params(module, x)
    apply = jax.jit(module.apply)  # op by op, every operation would be compiled on its own
    out = apply({'params': params}, x, None, AttentionInputs(packed, bias=bias))
    for start, end in ((0, 3), (3, 7)):
        valid = jnp.ones((1, end - start), bool)
        alone = AttentionInputs(
            AttentionMask(valid, valid, causal=True), bias=bias[:, :, start:end, start:end]
        )
        own = apply({'params': params}, x[:, start:end], None, alone)
        np.testing.assert_allclose(out[:, start:end], own, atol=1e-5)


def test_the_setting_is_checked_and_refused_by_what_cannot_hold_it():
    """model.attention_scale: a float > 0 or None, a bad value refused in one line; MarianMT,
    fairseq's families, the CTranslate2 export (but for T5's buckets) and the PyTorch peer
    take only the default, T5's Hugging Face export only 1.0."""
    cfg = TransformerConfig(vocab_size=32, attention_scale=1.0)
    assert TransformerConfig(vocab_size=32).attention_scale is None
    assert TransformerConfig(vocab_size=32, attention_scale=1).attention_scale == 1
    for bad, wanted in ((0.0, 'must be > 0.'), (-1.0, 'must be > 0.'), ('1', 'must be')):
        with pytest.raises(fields.ConfigError, match=wanted) as error:
            TransformerConfig(vocab_size=32, attention_scale=bad)
        assert str(error.value).startswith(f'model.attention_scale={bad!r} ')
        assert '\n' not in str(error.value)
    # Each format with a model it writes: the default, or the family's options (fairseq's).
    both = dict(pre_layer_norm=True, attention_bias=True, special=FAIRSEQ_IDS)
    options = {spec.name: spec.options | both for spec in SPECS.values()}
    options['mbart']['max_positions'] = 64  # its learned table's rows
    for format, name in (
        *((f.writes, f.name) for f in interop.FAMILIES if f.name != 't5'),
        (ctranslate2_spec.WRITES, None),
    ):
        base = TransformerConfig(vocab_size=32, **options.get(name, {}))
        refusal = export_refusal(dataclasses.replace(base, attention_scale=1.0), format)
        assert refusal.startswith('model.attention_scale=1.0 cannot be exported'), refusal
        assert export_refusal(base, format) is None
    # T5's export the other way round: its logits unscaled, the default refused.
    (t5,) = (f for f in interop.FAMILIES if f.name == 't5')
    settings_t5 = t5_model_settings({'d_model': 16, 'num_heads': 2, 'd_kv': 8, 'd_ff': 32}, 'x')
    keep = {f.name for f in dataclasses.fields(TransformerConfig)}
    base = TransformerConfig(vocab_size=32, **{k: v for k, v in settings_t5.items() if k in keep})
    assert export_refusal(base, t5.writes) is None
    refusal = export_refusal(dataclasses.replace(base, attention_scale=None), t5.writes)
    assert refusal.startswith('model.attention_scale=None cannot be exported'), refusal
    assert 'is not built by the PyTorch peer' in settings.peer_refusal(cfg)


@pytest.mark.slow
def test_the_model_reads_the_setting():
    """A Transformer with attention_scale=1/sqrt(H) equals the default to float32 rounding;
    scale 1.0 changes its logits."""
    from tests.random_params import fill_random
    from transformer.model import Transformer, abstract_params

    src, tgt = jnp.asarray([[3, 4, 5, 0]]), jnp.asarray([[1, 6, 7, 2]])
    kwargs = dict(vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1)
    kwargs |= dict(num_decoder_layers=1, attention_impl='einsum')
    config = lambda scale: TransformerConfig(**kwargs, attention_scale=scale)  # noqa: E731
    params = fill_random(abstract_params(Transformer(config(None))))
    logits = {}
    for scale in (None, 8**-0.5, 1.0):
        model = Transformer(config(scale))
        logits[scale] = np.asarray(jax.jit(model.apply)({'params': params}, src, tgt))
    np.testing.assert_allclose(logits[8**-0.5], logits[None], atol=1e-5)
    assert np.abs(logits[1.0] - logits[None]).max() > 1e-3
