"""The loss, its smoothing floor, and bfloat16 compute of the train step."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.random_params import fill_random
from tests.tiny_run import LEARNING_WARMUP, packed_batch, tiny_model, tiny_parallel
from transformer.configs import base
from transformer.model import Transformer, abstract_params
from transformer.training import optim, steps


def _state(model, tx) -> steps.TrainState:
    """A fresh state of random parameters: compiling the real initialisers costs seconds per
    model on a CPU, and what these tests compare holds for any values."""
    params = fill_random(abstract_params(model))
    return jax.device_put(
        steps.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params))
    )


def _train_step(model, tx, schedule):
    """The train step of ``model`` with label smoothing 0.1 and no accumulation."""
    return functools.partial(
        steps.train_step,
        model=model,
        tx=tx,
        schedule=schedule,
        label_smoothing=0.1,
        accum_steps=1,
    )


def test_label_smoothing_matches_direct_computation():
    """The closed form equals -sum_v q_v log p_v with the smoothed one-hot q built explicitly."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 5, 7)) * 3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 7, size=(2, 5)))
    weights = jnp.asarray(rng.integers(0, 2, size=(2, 5)), jnp.float32)
    eps = 0.1

    @jax.jit  # one program, not its ops one by one
    def both(logits, targets, weights):
        q = jax.nn.one_hot(targets, 7) * (1 - eps) + (1 - jax.nn.one_hot(targets, 7)) * eps / 6
        direct = -(q * jax.nn.log_softmax(logits)).sum(-1)
        plain = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        ours = steps.cross_entropy_with_smoothing(logits, targets, weights, eps)
        unsmoothed = steps.cross_entropy_with_smoothing(logits, targets, weights, 0.0)
        return ours, ((direct * weights).sum(), (plain * weights).sum()), unsmoothed

    (loss, nll), (want_loss, want_nll), (loss0, nll0) = both(logits, targets, weights)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(nll, want_nll, rtol=1e-5)
    np.testing.assert_allclose(loss0, nll0, rtol=1e-6)


def test_loss_gradient_equals_autodiff_of_the_log_softmax_form():
    """The written-out gradient (softmax - q, per output's cotangent) equals autodiff of
    -sum_v q_v log_softmax(z)_v and of the NLL, in float32 and for bfloat16 logits."""
    rng = np.random.default_rng(1)
    targets = jnp.asarray(rng.integers(0, 11, size=(3, 4)))
    weights = jnp.asarray(rng.integers(0, 2, size=(3, 4)), jnp.float32)
    eps = 0.1
    q = jax.nn.one_hot(targets, 11) * (1 - eps) + (1 - jax.nn.one_hot(targets, 11)) * eps / 10

    def mixed(loss_fn):
        # Both outputs get a cotangent: 1.0 on the smoothed sum, 0.3 on the NLL sum.
        return lambda z: (lambda s, n: s + 0.3 * n)(*loss_fn(z))

    def direct(z):
        log_probs = jax.nn.log_softmax(z.astype(jnp.float32))
        smoothed = -(q * log_probs).sum(-1)
        nll = -jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
        return (smoothed * weights).sum(), (nll * weights).sum()

    ours = functools.partial(
        steps.cross_entropy_with_smoothing, targets=targets, weights=weights, label_smoothing=eps
    )
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)):
        logits = jnp.asarray(rng.normal(size=(3, 4, 11)) * 3, dtype)
        got = jax.jit(jax.grad(mixed(ours)))(logits)  # compiled, not op by op
        assert got.dtype == dtype
        want = jax.jit(jax.grad(mixed(direct)))(logits)
        np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tol, atol=tol)
        assert np.abs(np.float32(got)).max() > 0.1  # not a vanishing gradient


def test_smoothed_loss_is_finite_and_floor_is_its_minimum():
    """Extreme logits give a finite loss; logits = log q reach exactly the constant floor."""
    targets = np.array([[2, 0]])
    weights = np.ones((1, 2), np.float32)
    one_hot = np.eye(5, dtype=np.float32)[targets]
    huge = np.where(one_hot > 0, 1e4, -1e4).astype(np.float32)
    loss_of = jax.jit(functools.partial(steps.cross_entropy_with_smoothing, label_smoothing=0.1))
    loss, _ = loss_of(huge, targets, weights)
    assert np.isfinite(loss)
    q = one_hot * 0.9 + (1 - one_hot) * 0.1 / 4
    best, _ = loss_of(np.log(q), targets, weights)
    np.testing.assert_allclose(best / 2, steps.smoothing_floor(5, 0.1), rtol=1e-5)
    assert steps.smoothing_floor(5, 0.0) == 0.0


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params():
    """model.dtype='bfloat16' computes in bfloat16 (close to the float32 loss) while the
    parameters and optimizer state stay float32. One device's step of the trainer's
    `Parallel`: the float32 one is tests/training/test_parallel.py's reference run's program,
    which the suite's compilation cache (tests/conftest.py) compiles once for both."""
    losses = {}
    float32 = {jnp.dtype('float32')}
    for dtype in (jnp.float32, jnp.bfloat16):
        model = Transformer(dataclasses.replace(tiny_model().config, dtype=dtype))
        assert {x.dtype for x in jax.tree.leaves(abstract_params(model))} == float32  # init's
        par, model, tx = tiny_parallel(
            jax.devices('cpu')[:1], model=model, warmup_steps=LEARNING_WARMUP
        )
        state = jax.device_put(_state(model, tx), par.shardings)
        state, sums = par.train_step(state, packed_batch(0), jax.random.key(1))
        losses[dtype] = float(sums['loss'] / sums['tokens'])
        assert {x.dtype for x in jax.tree.leaves(state)} == float32 | {jnp.dtype('int32')}
        assert {x.dtype for x in jax.tree.leaves(state.params)} == float32
    assert losses[jnp.bfloat16] != losses[jnp.float32]  # it did compute in bfloat16
    np.testing.assert_allclose(losses[jnp.bfloat16], losses[jnp.float32], rtol=2e-2)


@pytest.mark.slow
def test_dropout_prngs_are_deterministic_per_seed_and_differ_between_seeds():
    """Every train.dropout_prng (threefry, rbg, unsafe_rbg, philox4x32): the same (seed, step)
    draws the same masks, a bit-identical step loss (what exact resumption needs), another
    seed other masks. The step is compiled for its loss alone: XLA drops the gradient and
    the update, which no output then needs, and compiles in half the time; the four
    generators' steps are one program, compiled once."""
    opt = base.get_config().opt
    tx, schedule = optim.make_optimizer(opt, d_model=32)
    model = Transformer(dataclasses.replace(tiny_model().config, dropout_rate=0.3))
    train_step = _train_step(model, tx, schedule)

    @jax.jit
    def step_losses(state, batch, keys):
        return [train_step(state, batch, key)[1]['loss'] for key in keys]

    state = _state(model, tx)

    def losses(seed):
        keys = [steps.dropout_key(seed, prng) for prng in steps.DROPOUT_PRNGS]
        return step_losses(state, packed_batch(0), keys)

    first, again, other = losses(0), losses(0), losses(1)
    for i, prng in enumerate(steps.DROPOUT_PRNGS):
        assert float(first[i]) == float(again[i]), prng
        assert float(first[i]) != float(other[i]), prng
    with pytest.raises(ValueError, match='dropout_prng'):
        steps.dropout_key(0, 'philox')
