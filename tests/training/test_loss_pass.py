"""``train.loss_pass``: the 'accumulate' pass (float32 sums over the logits in their own dtype,
transformer/training/loss.py) computes the 'float32' pass's loss and gradients, with label
smoothing, padding weights and the chunked loss, in float32 and in bfloat16.

Tolerances: a bfloat16 -> float32 conversion is exact, so the two passes add the same float32
numbers, in an order that may differ (the logits' sum is a product with ones in 'accumulate'):
`RTOL` relative of the loss, and of each gradient's largest entry, covers float32 rounding of
that order; a bfloat16 gradient may move one bfloat16 rounding step (2^-8 relative) where a
float32 difference crosses a rounding boundary.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model, tiny_parallel
from transformer import schema
from transformer.fields import ConfigError
from transformer.training import loss as loss_lib
from transformer.training import steps

EPS = 0.1
RTOL = 1e-5
BF16_STEP = 2.0**-8


def _close(got, want, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        scale = max(float(np.abs(w).max()), 1e-30)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


def _logits_problem(dtype, vocab=300):
    """[3, 7, V] logits (some large: a softmax far from uniform), targets, weights with
    padding zeros."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 7, vocab)) * 4, dtype)
    targets = jnp.asarray(rng.integers(0, vocab, (3, 7)), jnp.int32)
    weights = jnp.asarray(rng.random((3, 7)) < 0.7, jnp.float32)
    assert 0 < float(weights.sum()) < weights.size
    return logits, targets, weights


@pytest.mark.parametrize('dtype, grad_rtol', [(jnp.float32, RTOL), (jnp.bfloat16, BF16_STEP)])
def test_accumulate_pass_equals_the_float32_pass_on_logits(dtype, grad_rtol):
    """Summed smoothed loss and NLL, and the gradient w.r.t. the logits (in the logits' dtype),
    of both passes: within `RTOL` (values) and ``grad_rtol`` (gradients)."""
    logits, targets, weights = _logits_problem(dtype)

    def sums(loss_pass):
        def both(z):
            return steps.cross_entropy_with_smoothing(z, targets, weights, EPS, loss_pass)

        (smoothed, nll), vjp = jax.vjp(both, logits)
        # Both outputs' cotangents, so that the NLL's gradient term is checked too.
        (grad,) = vjp((jnp.float32(1.0), jnp.float32(0.5)))
        return smoothed, nll, grad

    want = jax.jit(sums, static_argnums=0)('float32')
    got = jax.jit(sums, static_argnums=0)('accumulate')
    assert got[2].dtype == dtype
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL)
    np.testing.assert_allclose(got[1], want[1], rtol=RTOL)
    _close(got[2], want[2], grad_rtol)
    # Padding positions get no gradient in either pass.
    assert not np.asarray(got[2], np.float32)[np.asarray(weights) == 0].any()


def test_accumulated_token_losses_equal_token_losses_of_the_float32_copy():
    """Per position, bfloat16 logits: smoothed loss, NLL and logsumexp of
    `accumulated_token_losses` equal `token_losses` of the float32 copy within `RTOL`."""
    logits, targets, _ = _logits_problem(jnp.bfloat16)
    want = loss_lib.token_losses(logits.astype(jnp.float32), targets, EPS)
    got = jax.jit(loss_lib.accumulated_token_losses, static_argnums=2)(logits, targets, EPS)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, w, rtol=RTOL)


def _projection_problem(vocab=300, d=16):
    """Hidden states [2, 9, D], a projection with a bias, targets, weights with zeros."""
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(2, 9, d)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, d)) / np.sqrt(d) * 4, jnp.float32)
    bias = jnp.asarray(rng.normal(size=(vocab,)) * 0.1, jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, (2, 9)), jnp.int32)
    weights = jnp.asarray(rng.random((2, 9)) < 0.8, jnp.float32)
    return hidden, weight, bias, targets, weights


@pytest.mark.parametrize('dtype, grad_rtol', [(jnp.float32, RTOL), (jnp.bfloat16, BF16_STEP)])
def test_chunked_loss_and_gradients_equal_under_both_passes(dtype, grad_rtol):
    """`fused_cross_entropy` in chunks of 4 tokens (9 positions: the last chunk padded): the
    three sums and the gradients w.r.t. hidden states, projection and bias of 'accumulate'
    equal 'float32''s (the correct count exactly). In bfloat16 the sums are within
    ``grad_rtol`` too: XLA may keep a chunk's product + bias in float32 where the 'float32'
    pass converts it (``xla_allow_excess_precision``), and 'accumulate' reads it rounded to
    bfloat16, the model's logits' dtype (measured here: 2e-4 relative)."""
    hidden, weight, bias, targets, weights = _projection_problem()

    @functools.partial(jax.jit, static_argnums=0)
    def run(loss_pass):
        def fn(h, w, b):
            return loss_lib.fused_cross_entropy(h, w, b, targets, weights, EPS, 4, dtype, loss_pass)

        sums = fn(hidden, weight, bias)
        grads = jax.grad(lambda *a: fn(*a)[0], argnums=(0, 1, 2))(hidden, weight, bias)
        return sums, grads

    (want, want_grads), (got, got_grads) = run('float32'), run('accumulate')
    assert got[2] == want[2]
    np.testing.assert_allclose(got[:2], want[:2], rtol=RTOL if dtype == jnp.float32 else grad_rtol)
    # float32 gradients, accumulated from the chunks' gradients in ``dtype``.
    _close(got_grads, want_grads, grad_rtol)


@pytest.mark.slow
def test_model_loss_and_gradients_equal_under_both_passes():
    """The tiny bfloat16 model on packed rows with padding, full logits: loss sums and every
    parameter's gradient of 'accumulate' equal 'float32''s (the correct count exactly)."""
    model = tiny_model(dtype=jnp.bfloat16)
    batch = packed_batch(0)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'], batch['targets'])
    params = fill_random(nn.unbox(shapes['params']), seed=1, logits_scale=4.0)

    @functools.partial(jax.jit, static_argnums=0)
    def grads(loss_pass):
        fn = jax.grad(steps.loss_sums, has_aux=True)
        return fn(params, batch, model, EPS, None, 0, loss_pass)

    want_grads, want = grads('float32')
    got_grads, got = grads('accumulate')
    assert got['correct'] == want['correct'] and got['tokens'] == want['tokens']
    np.testing.assert_allclose(got['loss'], want['loss'], rtol=RTOL)
    np.testing.assert_allclose(got['nll'], want['nll'], rtol=RTOL)
    _close(got_grads, want_grads, BF16_STEP)


def test_an_unknown_loss_pass_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"train.loss_pass must be one of 'float32', 'acc"):
        steps.cross_entropy_with_smoothing(*_logits_problem(jnp.float32), EPS, 'float16')
    with pytest.raises(ConfigError, match='loss_pass'):
        schema.TrainSection(**{**_train_defaults(), 'loss_pass': 'float16'})


def _train_defaults() -> dict:
    return {
        f.name: f.default
        for f in dataclasses.fields(schema.TrainSection)
        if f.default is not dataclasses.MISSING
    }


def test_parallel_hands_the_loss_pass_to_the_train_and_eval_steps():
    """`Parallel` passes ``loss_pass`` to both steps: an unknown one fails as each is traced."""
    par, model, tx = tiny_parallel(jax.devices()[:1], label_smoothing=EPS, loss_pass='float16')
    state = par.put_state(par.init_state(lambda: steps.init_state(model, tx, jax.random.key(0), 8)))
    batch = par.put_batch(packed_batch(0))
    with pytest.raises(ValueError, match='train.loss_pass must be one of'):
        par.lower_step(state, batch, jax.random.key(1))
    with pytest.raises(ValueError, match='train.loss_pass must be one of'):
        par.eval_step(state.params, batch)
