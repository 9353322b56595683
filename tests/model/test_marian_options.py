"""The options Hugging Face MarianMT (OPUS-MT) checkpoints use, each declared once: the swish
and exact-GELU feed-forwards (model.ffn, transformer/model/feed_forward.py), the attention's
projection biases (model.attention_bias, a setting of transformer/model/settings.py) and the
bias on the logits (model.logits_bias, a part of transformer/model/variants.py; fixed in
training unless opt.train_logits_bias). Each computes its formula, has the declared
parameters, and reaches every path that makes logits: teacher forcing, the chunked loss, cached
decoding. tests/test_export.py checks that MarianMT and CTranslate2 compute the same."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.model.test_model import (
    V,
    encode_and_forward,
    forward,
    random_params,
    random_tokens,
    tiny_config,
)
from tests.random_params import fill_random
from tests.tiny_run import packed_batch
from transformer import schema
from transformer.model import (
    FeedForward,
    Transformer,
    abstract_params,
    decode_step,
    flops,
    init_cache,
    logical_partition_specs,
    param_count,
    param_shapes,
    variants,
)
from transformer.model.attention import MultiHeadAttention
from transformer.training import optim, steps


def _tree_shapes(params) -> dict[str, tuple[int, ...]]:
    return {
        '/'.join(k.key for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(
    'ffn, formula',
    [('swish', lambda h: h / (1.0 + np.exp(-h))), ('gelu', _gelu_erf)],
)
def test_the_swish_and_gelu_feed_forwards_are_their_formulas(ffn, formula):
    """act(x W1 + b1) W2 + b2 on ReLU's weights, in float64 numpy: swish = x sigmoid(x), gelu
    the exact x Phi(x) of Hugging Face's "gelu" (not jax's tanh default, which the inputs here,
    pre-activations of std ~3, tell apart by > 1e-4). float32 products at full precision."""
    cfg = tiny_config(ffn=ffn)
    assert variants.chosen(cfg, 'ffn').weights(cfg) == variants.chosen(
        tiny_config(), 'ffn'
    ).weights(cfg)  # the same weights as ReLU
    p = random_params(cfg)['encoder_layer_0']['ffn']
    x = 3.0 * np.random.default_rng(1).standard_normal((2, 5, cfg.d_model)).astype(np.float32)
    with jax.default_matmul_precision('float32'):
        ours = np.asarray(FeedForward(cfg).apply({'params': p}, x, True), np.float64)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    h = x @ f64(p['wi']['kernel']) + f64(p['wi']['bias'])
    assert np.abs(h).max() > 3
    want = formula(h) @ f64(p['wo']['kernel']) + f64(p['wo']['bias'])
    np.testing.assert_allclose(ours, want, atol=2e-5)
    if ffn == 'gelu':
        tanh = _gelu_tanh(h) @ f64(p['wo']['kernel']) + f64(p['wo']['bias'])
        assert np.abs(ours - tanh).max() > 1e-4


def test_attention_biases_are_the_declared_parameters_and_count_no_flops():
    """model.attention_bias: query [N, H], key and value [K, H], out [D] in each attention, as
    settings.py declares (the tree, the count); biases are no products (the FLOPs stay)."""
    plain = tiny_config(num_kv_heads=2)
    cfg = tiny_config(num_kv_heads=2, attention_bias=True)
    tree = _tree_shapes(abstract_params(Transformer(cfg)))
    assert param_shapes(cfg) == tree
    assert param_count(cfg) == sum(map(math.prod, tree.values()))
    attention = {k.split('/', 2)[2]: v for k, v in tree.items() if '/cross_attention/' in k}
    heads, head_dim, kv_heads, d = cfg.num_heads, cfg.d_model // cfg.num_heads, 2, cfg.d_model
    assert {k: v for k, v in attention.items() if k.endswith('bias')} == {
        'query/bias': (heads, head_dim),
        'key/bias': (kv_heads, head_dim),
        'value/bias': (kv_heads, head_dim),
        'out/bias': (d,),
    }
    attentions = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
    biases = heads * head_dim + 2 * kv_heads * head_dim + d
    assert param_count(cfg) - param_count(plain) == attentions * biases
    assert flops.forward_flops(cfg, 2, 5, 3) == flops.forward_flops(plain, 2, 5, 3)


@pytest.mark.parametrize('num_kv_heads', [None, 2])
def test_biased_self_attention_equals_its_formula(num_kv_heads):
    """Self-attention's projections applied as one stacked einsum with stacked biases
    (projections.fused_projections: q, k, v in one product, or k and v with fewer heads) equal
    q = x W_q + b_q, ... , out = Concat(heads) W_o + b_o in float64 numpy."""
    n, d = 4, 16
    attention = MultiHeadAttention(num_heads=n, num_kv_heads=num_kv_heads, use_bias=True)
    x = np.random.default_rng(2).standard_normal((2, 5, d)).astype(np.float32)
    p = fill_random(nn.unbox(jax.eval_shape(attention.init, jax.random.key(0), x)['params']), 3)
    with jax.default_matmul_precision('float32'):
        ours = np.asarray(attention.apply({'params': p}, x), np.float64)
    f64 = {k: {n_: np.asarray(a, np.float64) for n_, a in v.items()} for k, v in p.items()}
    project = lambda name: (  # noqa: E731
        np.einsum('BTD,DNH->BTNH', x, f64[name]['kernel']) + f64[name]['bias']
    )
    q, k, v = project('query'), project('key'), project('value')
    group = n // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    logits = np.einsum('BTNH,BSNH->BNTS', q, k) / math.sqrt(q.shape[-1])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum('BNTS,BSNH->BTNH', probs, v)
    want = np.einsum('BTNH,NHD->BTD', heads, f64['out']['kernel']) + f64['out']['bias']
    np.testing.assert_allclose(ours, want, atol=1e-5)


def test_attention_biases_change_the_logits():
    cfg = tiny_config(attention_bias=True)
    params = random_params(cfg)
    inputs, targets = random_tokens(3, (2, 5)), random_tokens(4, (2, 4))
    biased = np.asarray(forward(cfg, params, inputs, targets))

    def zero_attention_biases(path, a):
        in_attention = 'attention' in jax.tree_util.keystr(path)
        return a * 0 if in_attention and path[-1].key == 'bias' else a

    zeroed = jax.tree_util.tree_map_with_path(zero_attention_biases, params)
    assert np.abs(biased - np.asarray(forward(cfg, zeroed, inputs, targets))).max() > 1e-2


def _with_logits_bias(cfg, seed: int = 0) -> dict:
    params = random_params(cfg, seed)
    params['logits_bias'] = np.linspace(-2.0, 2.0, V, dtype=np.float32)
    return params


def test_the_logits_bias_is_the_declared_parameter_and_shifts_the_logits_by_itself():
    """model.logits_bias: one top-level 'logits_bias' [V] ('vocab' its logical axis), as
    variants.py declares; the teacher-forced logits are those without it plus it."""
    cfg = tiny_config(logits_bias=True)
    tree = _tree_shapes(abstract_params(Transformer(cfg)))
    assert param_shapes(cfg) == tree and tree['logits_bias'] == (V,)
    assert param_count(cfg) - param_count(tiny_config()) == V
    specs = logical_partition_specs(Transformer(cfg))
    assert tuple(specs['logits_bias']) == ('vocab',)
    params = _with_logits_bias(cfg)
    inputs, targets = random_tokens(5, (2, 5)), random_tokens(6, (2, 4))
    with_bias = np.asarray(forward(cfg, params, inputs, targets))
    zero = params | {'logits_bias': np.zeros(V, np.float32)}
    without = np.asarray(forward(cfg, zero, inputs, targets))
    shift = np.broadcast_to(params['logits_bias'], with_bias.shape)
    np.testing.assert_allclose(with_bias - without, shift, atol=1e-6)


@pytest.mark.parametrize('share_embeddings', ['all', 'none'])
def test_the_chunked_loss_adds_the_logits_bias_as_the_logits_do(share_embeddings):
    """train.loss_chunk_tokens > 0 (transformer/training/loss.py, from output_projection's bias)
    gives the full-logits loss sums, and (tied embeddings) gradients, the bias's own included."""
    cfg = tiny_config(logits_bias=True, share_embeddings=share_embeddings)
    model = Transformer(cfg)
    params = jax.tree.map(jnp.asarray, _with_logits_bias(cfg))
    batch = {k: v % V for k, v in packed_batch(7).items() if k in ('inputs', 'targets')}
    with_grads = share_embeddings == 'all'

    @jax.jit
    def both():
        def sums(chunk_tokens):
            loss = lambda p: steps.loss_sums(p, batch, model, 0.1, None, chunk_tokens)  # noqa: E731
            if not with_grads:
                return loss(params)[1], None
            (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
            return metrics, grads

        return sums(0), sums(16)

    with jax.default_matmul_precision('float32'):
        (plain, plain_grads), (chunked, chunked_grads) = both()
    for key in ('loss', 'nll', 'correct', 'tokens'):
        np.testing.assert_allclose(chunked[key], plain[key], rtol=1e-5)
    if with_grads:
        assert np.abs(plain_grads['logits_bias']).max() > 1e-3
        for a, b in zip(jax.tree.leaves(chunked_grads), jax.tree.leaves(plain_grads), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_cached_decoding_with_biases_equals_full_forward():
    """Decoding one position at a time (the cache, decode_step's logits) gives the teacher-
    forced logits, attention biases and logits bias included."""
    cfg = tiny_config(logits_bias=True, attention_bias=True, ffn='gelu', num_decoder_layers=2)
    model, params = Transformer(cfg), _with_logits_bias(cfg)
    b, s, t = 2, 5, 4
    inputs = random_tokens(13, (b, s), lengths=[5, 3])
    targets = random_tokens(14, (b, t), lengths=[4, 2])
    encoded, full = encode_and_forward(cfg, params, inputs, targets)
    cache = jax.jit(init_cache, static_argnums=(0, 4))(model, params, encoded, inputs, t)
    step = jax.jit(functools.partial(decode_step, model))
    previous, stepwise = np.zeros(b, np.int32), []
    for pos in range(t):
        logits, cache = step(params, cache, encoded, inputs, previous)
        stepwise.append(np.asarray(logits))
        previous = targets[:, pos]
    real = targets != 0
    np.testing.assert_allclose(np.stack(stepwise, 1)[real], np.asarray(full)[real], atol=1e-5)


@pytest.mark.parametrize('train_logits_bias', [False, True])
def test_the_logits_bias_is_fixed_unless_trained(train_logits_bias):
    """Three Adam steps (weight decay and clipping on) of random gradients move every other
    parameter; the logits' bias only with opt.train_logits_bias (Hugging Face's is a buffer). A
    tree without the bias is updated too; the attention's [N, H] biases are not decayed."""
    cfg = tiny_config(logits_bias=True, attention_bias=True)
    params = jax.tree.map(jnp.asarray, _with_logits_bias(cfg))
    opt = schema.default_config().opt
    opt.update(schedule='constant', lr_scale=1e-2, weight_decay=0.1, clip_grad_norm=1.0)
    opt.train_logits_bias = train_logits_bias
    tx, _ = optim.make_optimizer(opt, cfg.d_model)

    @jax.jit
    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return jax.tree.map(jnp.add, params, updates), state

    state, new = tx.init(params), params
    for seed in range(3):
        new, state = update(new, state, jax.tree.map(jnp.asarray, random_params(cfg, seed)))
    moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), params, new)
    assert moved.pop('logits_bias') is train_logits_bias
    assert all(jax.tree.leaves(moved))
    if not train_logits_bias:  # the fixing optimizer builds and updates a tree without it
        without = {k: v for k, v in params.items() if k != 'logits_bias'}
        updates, _ = jax.eval_shape(tx.update, without, jax.eval_shape(tx.init, without), without)
        assert jax.tree.structure(updates) == jax.tree.structure(without)
    decays = optim.decays(params)['encoder_layer_0']['self_attention']
    assert decays['query'] == {'kernel': True, 'bias': False}
