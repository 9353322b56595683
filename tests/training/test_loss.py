"""The chunked loss (transformer/training/loss.py, ``train.loss_chunk_tokens``) against the
full-logits loss: the same sums and gradients, and far less temporary memory."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model
from transformer.model import Transformer
from transformer.training import steps
from transformer.training.loss import fused_cross_entropy

EPS = 0.1


def _assert_trees_close(got, want, rtol=1e-5):
    """Each leaf within rtol of the other, relative to the leaf's largest entry."""
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want), strict=True
    ):
        assert g.dtype == w.dtype, path
        scale = max(np.abs(np.float32(w)).max(), 1e-30)
        np.testing.assert_allclose(
            np.float32(g), np.float32(w), rtol=rtol, atol=rtol * scale, err_msg=str(path)
        )


def _model_and_params(share: str, seed: int = 0):
    model = Transformer(
        dataclasses.replace(tiny_model().config, share_embeddings=share, dropout_rate=0.1)
    )
    batch = packed_batch(0)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'], batch['targets'])
    return model, fill_random(nn.unbox(shapes['params']), seed=seed, logits_scale=4.0)


@pytest.mark.parametrize('share', ['all', 'none'])
def test_chunked_loss_and_gradients_equal_full_logits(share):
    """Packed rows with padding (8 x 12 positions, 56 real tokens) in chunks of 43 tokens
    (5 positions of each row, which do not divide 12: the last chunk is padded): the sums and
    every parameter's gradient equal the full-logits ones, and so do the evaluation step's
    sums (no gradient: the forward-only path)."""
    model, params = _model_and_params(share, seed=1)
    batch = packed_batch(0)

    @jax.jit  # both sides and the evaluation step in one program: one compilation
    def sides(params):
        def grads(chunk):
            return jax.grad(steps.loss_sums, has_aux=True)(params, batch, model, EPS, None, chunk)

        chunked = dict(model=model, label_smoothing=EPS, loss_chunk_tokens=43)
        return grads(0), grads(43), steps.eval_step(params, batch, **chunked)

    (want_grads, want_sums), (got_grads, got_sums), evaluated = sides(params)
    assert want_sums['tokens'] == 56
    _assert_trees_close(got_sums, want_sums)
    _assert_trees_close(got_grads, want_grads)
    _assert_trees_close(evaluated, want_sums)


def test_chunked_loss_under_gradient_accumulation():
    """accumulated_grads with 2 micro-batches of 4 rows, in chunks of 20 tokens (5 positions
    of each row), with dropout: the same sums and gradients as the full logits."""
    model, params = _model_and_params('all', seed=2)
    batch = packed_batch(1)

    @jax.jit  # both sides in one program: one compilation
    def sides(params, batch):
        key = jax.random.key(3)
        return [steps.accumulated_grads(params, batch, model, EPS, key, 2, c) for c in (0, 20)]

    (want_grads, want_sums), (got_grads, got_sums) = sides(params, batch)
    _assert_trees_close(got_sums, want_sums)
    _assert_trees_close(got_grads, want_grads)


def _projection_problem(seed: int, vocab: int = 40, d: int = 16):
    """Hidden states [2, 9, D], a projection with a bias, targets of which about half are the
    argmax (so the correct count is neither 0 nor all) and weights with zeros."""
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(2, 9, d)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, d)) / np.sqrt(d) * 3, jnp.float32)
    bias = jnp.asarray(rng.normal(size=(vocab,)) * 0.1, jnp.float32)
    best = np.asarray(jnp.argmax(hidden @ weight.T + bias, -1))
    targets = np.where(rng.random((2, 9)) < 0.5, best, rng.integers(0, vocab, (2, 9)))
    weights = jnp.asarray(rng.random((2, 9)) < 0.8, jnp.float32)
    return hidden, weight, bias, jnp.asarray(targets, jnp.int32), weights


def _full_logits_sums(hidden, weight, bias, targets, weights, dtype):
    """The full-logits reference: logits in ``dtype`` as Transformer.decode makes them."""
    logits = (hidden.astype(dtype) @ weight.astype(dtype).T + bias.astype(dtype)).astype(
        jnp.float32
    )
    loss, nll = steps.cross_entropy_with_smoothing(logits, targets, weights, EPS)
    correct = ((logits.argmax(-1) == targets) * weights).sum()
    return loss, nll, correct


@pytest.mark.parametrize('dtype, rtol', [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_fused_cross_entropy_with_bias_equals_full_logits(dtype, rtol):
    """The three sums and the gradients w.r.t. hidden states, projection and bias, in chunks of
    4 tokens (2 positions of each of 2 rows; 9 positions, so the last chunk is padded);
    bfloat16 products (float32 statistics) stay close to the reference and give gradients in
    the inputs' float32."""
    hidden, weight, bias, targets, weights = _projection_problem(3)
    fused = functools.partial(fused_cross_entropy, label_smoothing=EPS, chunk_tokens=4, dtype=dtype)
    # Each side compiled as one program: its ops one by one cost more to compile.
    got = jax.jit(fused)(hidden, weight, bias, targets, weights)
    want = jax.jit(_full_logits_sums, static_argnums=5)(
        hidden, weight, bias, targets, weights, dtype
    )
    assert 0 < want[2] < weights.sum()
    np.testing.assert_allclose(got, want, rtol=rtol)
    assert got[2] == want[2]

    def loss_of(fn):
        return jax.grad(lambda h, w, b: fn(h, w, b, targets, weights)[0], argnums=(0, 1, 2))

    got_grads = jax.jit(loss_of(fused))(hidden, weight, bias)
    want_grads = jax.jit(
        loss_of(lambda *a: _full_logits_sums(*a, dtype)),
    )(hidden, weight, bias)
    _assert_trees_close(got_grads, want_grads, rtol=rtol)
    # Only the smoothed loss is differentiable: the NLL and the count are stopped.
    nll_grad = jax.jit(jax.grad(lambda h: fused(h, weight, bias, targets, weights)[1]))(hidden)
    assert not np.asarray(nll_grad).any()


def test_chunked_train_step_needs_less_temporary_memory():
    """Compiled loss + gradient of a model whose logits dominate (2048 tokens, V 8000, D 64):
    chunks of 256 tokens save at least half of the float32 logits' 65.5 MB of temporaries."""
    cfg = dataclasses.replace(tiny_model().config, vocab_size=8000, d_model=64, num_heads=2)
    model = Transformer(cfg)
    tokens = jax.ShapeDtypeStruct((64, 32), jnp.int32)
    batch = {'inputs': tokens, 'targets': tokens}
    params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)['params'])

    def temp_bytes(chunk: int) -> int:
        grad_fn = jax.grad(
            functools.partial(steps.loss_sums, model=model, label_smoothing=EPS, rng=None),
            has_aux=True,
        )
        step = jax.jit(lambda p, b: grad_fn(p, b, loss_chunk_tokens=chunk))
        return step.lower(params, batch).compile().memory_analysis().temp_size_in_bytes

    logits_bytes = 64 * 32 * 8000 * 4
    full, chunked = temp_bytes(0), temp_bytes(256)
    assert full - chunked >= logits_bytes / 2, (full, chunked)
