"""The GPU paths, tested where they run: cuDNN's fused attention against einsum, the embedding
gradient variants, the chunked loss in bfloat16, the searches on either attention, and a short
training against the CPU's. Skipped, with the reason, on a machine without a GPU.

cuDNN's flash attention takes 16-bit inputs only, so its tests compute in bfloat16 and compare
with the einsum path in bfloat16 and with a float32 reference: the fused path must be no
further from float32 than `BF16_REL` of the output's scale (bfloat16 keeps 8 bits of
mantissa, ~0.4% a rounding; a softmax and two products round a few times).
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.decoding import test_decode
from tests.model import test_masks
from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model, tiny_run_config
from transformer import decoding as decode
from transformer.commands import train as trainer
from transformer.model import embedding
from transformer.model.attention import MultiHeadAttention
from transformer.training import steps

pytestmark = pytest.mark.skipif(
    jax.default_backend() != 'gpu', reason='needs a GPU: these test the kernels a GPU runs'
)
BF16_REL = 3e-2  # of max |float32 reference|, for bfloat16 outputs and gradients


def _max_abs(tree) -> float:
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32)))) for x in jax.tree.leaves(tree))


def _assert_bf16_close(got, want, name: str) -> None:
    scale = _max_abs(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=0, atol=BF16_REL * scale, err_msg=name)


@pytest.mark.parametrize('name', test_masks.CASES)
def test_cudnn_attention_equals_einsum(name):
    """bfloat16 outputs and gradients of cuDNN's attention (unpacked rows: lengths and
    is_causal; packed rows: the dense mask) within `BF16_REL` of the float32 einsum; the
    compiled program of the unpacked cases calls cuDNN."""
    t, s, mask = test_masks._case(name)
    d, heads = 128, 2  # head_dim 64, a size cuDNN's flash kernels take
    rng = np.random.default_rng(0)
    x_q = jnp.asarray(rng.standard_normal((3, t, d)), jnp.float32)
    self_attention = 'self' in name
    x_kv = x_q if self_attention else jnp.asarray(rng.standard_normal((3, s, d)), jnp.float32)

    def module(impl, dtype):
        return MultiHeadAttention(num_heads=heads, use_bias=True, attention_impl=impl, dtype=dtype)

    params = nn.unbox(module('einsum', jnp.float32).init(jax.random.key(1), x_q, x_kv)['params'])

    def loss(m, params, x_q, x_kv):
        y = m.apply({'params': params}, x_q, x_q if self_attention else x_kv, mask)
        return jnp.sum(y.astype(jnp.float32) ** 2), y

    def run(impl, dtype):
        fn = jax.jit(jax.value_and_grad(functools.partial(loss, module(impl, dtype)), (0, 1, 2),
                                        has_aux=True))  # fmt: skip
        return fn(params, x_q, x_kv), fn.lower(params, x_q, x_kv).compile().as_text()

    ((_, y_ref), g_ref), _ = run('einsum', jnp.float32)
    ((_, y_fused), g_fused), text = run('fused', jnp.bfloat16)
    ((_, y_einsum), g_einsum), _ = run('einsum', jnp.bfloat16)
    if 'packed' not in name:
        assert 'cudnn' in text.lower(), 'the fused path did not reach cuDNN'
    _assert_bf16_close(y_fused, y_ref, f'{name}: outputs')
    _assert_bf16_close(g_fused, g_ref, f'{name}: gradients')
    _assert_bf16_close(y_einsum, y_ref, f'{name}: the einsum reference itself')


@pytest.mark.parametrize('grad', ['one_hot', 'sorted_scatter'])
def test_embedding_gradients_equal_the_scatter_on_the_gpu(grad):
    """Each `model.embedding_grad` variant's gradient of a bfloat16 lookup of 4096 tokens over
    V 1000 equals the scatter's to float32 rounding (both sum float32 values)."""
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(1000, 64)), jnp.float32)
    tokens = jnp.asarray(rng.zipf(1.3, size=(8, 512)) % 1000, jnp.int32)  # frequent tokens
    cotangent = jnp.asarray(rng.normal(size=(8, 512, 64)), jnp.float32)

    def gradient(name):
        def loss(t):
            rows = embedding.lookup(t, tokens, jnp.bfloat16, name).astype(jnp.float32)
            return (rows * cotangent).sum()

        return jax.jit(jax.grad(loss))(table)

    want = gradient('scatter')
    np.testing.assert_allclose(gradient(grad), want, rtol=1e-5, atol=1e-5 * _max_abs(want))


def test_chunked_loss_in_bfloat16_equals_the_full_logits_on_the_gpu():
    """The model's loss sums and gradients in bfloat16 with chunks of 24 tokens against the
    full bfloat16 logits: within `BF16_REL`, the correct count within 2 tokens."""
    model = tiny_model(dtype=jnp.bfloat16)
    batch = packed_batch(0)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'], batch['targets'])
    params = fill_random(nn.unbox(shapes['params']), seed=1)

    def sums_and_grads(chunk):
        fn = jax.value_and_grad(steps.loss_sums, has_aux=True)
        return jax.jit(functools.partial(fn, model=model, label_smoothing=0.1, rng=None,
                                         loss_chunk_tokens=chunk))(params, batch)  # fmt: skip

    (full_loss, full), full_grads = sums_and_grads(0)
    (chunk_loss, chunked), chunk_grads = sums_and_grads(24)
    np.testing.assert_allclose(chunk_loss, full_loss, rtol=BF16_REL)
    assert abs(float(chunked['correct']) - float(full['correct'])) <= 2
    _assert_bf16_close(chunk_grads, full_grads, 'gradients')


def test_searches_give_the_same_outputs_on_fused_and_einsum_attention():
    """Greedy and beam search of a bfloat16 model with peaked distributions (as a trained
    model's): the same tokens with cuDNN's attention as with einsum (beam search's best beam,
    the translation; the lower beams hold near-ties that bfloat16 may order either way)."""
    outputs = {}
    for impl in ('einsum', 'fused'):
        config = dataclasses.replace(
            test_decode.MODEL.config, dtype=jnp.bfloat16, attention_impl=impl, head_dim=64
        )
        model = test_decode.MODEL.clone(config=config)
        shapes = jax.eval_shape(model.init, jax.random.key(0), *(jnp.ones((1, 2), jnp.int32),) * 2)
        wide = fill_random(nn.unbox(shapes['params']), seed=8, logits_scale=12.0)
        greedy = decode.greedy_search(
            model,
            wide,
            test_decode.INPUTS,
            options=decode.DecodeOptions(extra_length=3),
        )
        beams, _ = decode.beam_search(
            model,
            wide,
            test_decode.INPUTS,
            options=decode.DecodeOptions(extra_length=3),
        )
        outputs[impl] = (np.asarray(greedy), np.asarray(beams)[:, 0])
    np.testing.assert_array_equal(outputs['fused'][0], outputs['einsum'][0])
    np.testing.assert_array_equal(outputs['fused'][1], outputs['einsum'][1])


def test_twenty_steps_on_the_gpu_train_as_on_the_cpu(tmp_path):
    """configs/tiny.py shrunk, 20 steps with dropout on one GPU (its default TensorFloat-32
    float32 products) and on one CPU device: every logged loss within 1% of the CPU's, and
    both learn."""
    losses = {}
    for platform in ('cpu', 'gpu'):
        config = tiny_run_config(20)
        workdir = tmp_path / platform
        with jax.default_matmul_precision('default'):
            trainer.train_and_evaluate(config, str(workdir), devices=jax.devices(platform)[:1])
        records = [json.loads(line) for line in open(workdir / 'metrics.jsonl')]
        losses[platform] = [r['loss'] for r in records if r['split'] == 'train']
    assert len(losses['gpu']) == 20
    np.testing.assert_allclose(losses['gpu'], losses['cpu'], rtol=1e-2)
    assert losses['gpu'][-1] < losses['gpu'][0]
