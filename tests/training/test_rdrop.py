"""R-Drop (train.rdrop_alpha): its KL, its loss, its keys, and the steps and layouts it runs in."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.random_params import fill_random
from tests.tiny_run import LEARNING_WARMUP, packed_batch, tiny_model, tiny_parallel
from transformer import schema
from transformer.configs import base
from transformer.fields import ConfigError
from transformer.model import abstract_params
from transformer.training import rdrop, steps

# Jitted: one compilation of each gradient costs less than running its ops one by one.
_grads = jax.jit(
    steps.accumulated_grads, static_argnums=(2, 3, 5), static_argnames=('rdrop_alpha',)
)


def _params(model):
    """Random values on the model's parameter tree: what these tests compare holds for any
    values, and compiling the real initialisers costs seconds per model on a CPU."""
    return fill_random(abstract_params(model))


def _state(model, tx) -> steps.TrainState:
    params = _params(model)
    return steps.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params))


def test_symmetric_kl_equals_a_hand_computation():
    """0.5 (KL(p||q) + KL(q||p)) of two 3-way distributions, written out with numpy."""
    a, b = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.5, 2.0])
    p, q = np.exp(a) / np.exp(a).sum(), np.exp(b) / np.exp(b).sum()
    want = 0.5 * ((p * np.log(p / q)).sum() + (q * np.log(q / p)).sum())
    kl = jax.jit(rdrop.symmetric_kl)  # one program, not its ops one by one
    got = kl(jnp.asarray([a, b]), jnp.asarray([b, a]))
    np.testing.assert_allclose(got, [want, want], rtol=1e-6)
    assert want > 0.1
    assert float(kl(jnp.asarray(a), jnp.asarray(a))) == 0.0


def test_without_dropout_the_kl_is_zero_and_the_loss_is_the_plain_one():
    """With every dropout rate 0 both passes are one network: KL 0, the plain loss and gradient
    (packed rows), R-Drop's in 2 micro-batches against the plain one in one."""
    model = tiny_model()
    params, batch, key = _params(model), packed_batch(0), jax.random.key(3)
    plain_grads, plain = _grads(params, batch, model, 0.1, key, 1)
    grads, sums = _grads(params, batch, model, 0.1, key, 2, rdrop_alpha=5.0)
    assert float(sums[rdrop.KL_KEY]) == 0.0
    for k in steps.SUM_KEYS:
        np.testing.assert_allclose(sums[k], plain[k], rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_with_dropout_the_objective_adds_alpha_times_the_kl():
    """Dropout 0.3: the masks differ (KL > 0), the objective is the passes' mean loss + alpha x
    KL, the first pass is the plain step's (same key); validation (no rng) is the plain loss.
    R-Drop over 2 micro-batches with dropout: `test_sharding_over_devices_equals_one_device`."""
    model = tiny_model(dropout_rate=0.3)
    params, batch, key = _params(model), packed_batch(1), jax.random.key(3)

    @jax.jit  # R-Drop's loss and the plain loss of each of its keys: one program
    def losses(params, batch, key):
        keys = (key, rdrop.second_pass_key(key))
        plain = [steps.loss_sums(params, batch, model, 0.1, k)[0] for k in keys]
        return steps.loss_sums(params, batch, model, 0.1, key, rdrop_alpha=2.0), plain

    (objective, sums), (first, second) = losses(params, batch, key)
    kl = float(sums[rdrop.KL_KEY])
    assert kl > 0
    np.testing.assert_allclose(objective, sums['loss'] + 2.0 * kl, rtol=1e-6)
    np.testing.assert_allclose(sums['loss'], 0.5 * (first + second), rtol=1e-6)
    assert first != second
    per_token = steps.summarize(sums, 32, 0.1)[rdrop.KL_KEY]
    np.testing.assert_allclose(per_token, kl / float(sums['tokens']), rtol=1e-6)
    # Its output's keys: traced, not run.
    validation = functools.partial(steps.eval_step, model=model, label_smoothing=0.1)
    assert rdrop.KL_KEY not in jax.eval_shape(validation, params, batch)


@functools.cache
def _parallel(mode: str, num_devices: int):
    """(`Parallel`, model, optimizer): R-Drop (alpha 1) of the tiny model with dropout 0.3 in
    2 micro-batches, under a warm-up that moves its parameters; one per process, so that
    every test of its steps runs one compiled step."""
    model = tiny_model(dropout_rate=0.3)
    devices = jax.devices('cpu')[:num_devices]
    return tiny_parallel(
        devices, mode, model, rdrop_alpha=1.0, accum_steps=2, warmup_steps=LEARNING_WARMUP
    )


def _steps(mode, num_devices, num_steps=2):
    par, model, tx = _parallel(mode, num_devices)
    state = par.put_state(jax.device_put(_state(model, tx), par.shardings))
    out = []
    for step in range(num_steps):
        state, sums = par.train_step(state, packed_batch(step), jax.random.key(1))
        out.append({k: np.asarray(v).reshape(-1)[0] for k, v in jax.device_get(sums).items()})
    return out, jax.device_get(par.global_state(state).params)


@pytest.mark.slow  # two R-Drop steps compiled: its file runs among the first under -n
def test_sharding_over_devices_equals_one_device():
    """jit + sharding over 2 data devices draws the same masks as 1 device (the batch is
    global): same losses, KL and parameters; each of the 2 micro-batches' sums adds a KL > 0
    and the gradient is finite."""
    (one, params_one), (two, params_two) = _steps('sharding', 1), _steps('sharding', 2)
    for a, b in zip(one, two, strict=True):
        for key in ('loss', rdrop.KL_KEY, 'tokens', 'grad_norm'):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5)
        assert a[rdrop.KL_KEY] > 0
        assert np.isfinite(a['grad_norm']) and a['grad_norm'] > 0
    for a, b in zip(jax.tree.leaves(params_one), jax.tree.leaves(params_two), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.long
def test_pmap_runs():
    """pmap (each device its own key) trains with a finite KL > 0. Long tier: R-Drop's step is
    test_sharding_over_devices_equals_one_device's, pmap's tests/training/test_parallel.py's
    test_data_parallel_equals_one_device[pmap-8-1-0]."""
    pmapped, _ = _steps('pmap', 2, num_steps=1)
    assert np.isfinite(pmapped[0]['loss']) and pmapped[0][rdrop.KL_KEY] > 0


def test_a_resumed_step_draws_both_masks_again():
    """Both keys are functions of (seed, step, micro-batch): the second step taken from the
    first step's state alone (a resume) gives the same bits as in the uninterrupted run (one
    device's step of `test_sharding_over_devices_equals_one_device`)."""
    par, model, tx = _parallel('sharding', 1)
    base_key = steps.dropout_key(0)
    state = jax.device_put(_state(model, tx), par.shardings)
    first, _ = par.train_step(state, packed_batch(0), base_key)
    saved = jax.device_get(first)
    _, uninterrupted = par.train_step(first, packed_batch(1), base_key)
    restored = jax.device_put(saved, par.shardings)
    _, resumed = par.train_step(restored, packed_batch(1), steps.dropout_key(0))
    assert float(uninterrupted[rdrop.KL_KEY]) > 0
    for key in ('loss', rdrop.KL_KEY, 'grad_norm'):
        assert float(resumed[key]) == float(uninterrupted[key])


def test_the_chunked_loss_is_refused_in_one_line():
    config = base.get_config()
    config.train.rdrop_alpha, config.train.loss_chunk_tokens = 1.0, 4096
    with pytest.raises(ConfigError, match='train.rdrop_alpha=1.0 needs the logits') as e:
        schema.parse(config)
    assert '\n' not in str(e.value)
    model = tiny_model()
    with pytest.raises(ValueError, match='set train.loss_chunk_tokens=0'):
        steps.loss_sums(
            _params(model), packed_batch(0), model, 0.1, jax.random.key(0), 8, rdrop_alpha=1.0
        )


def test_the_written_out_kl_gradient_equals_autodiff():
    """`symmetric_kl`'s gradient to both logits equals autodiff of its formula."""
    z1, z2 = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4, 9)) * 2, jnp.float32)
    weights = jnp.arange(12.0).reshape(3, 4)

    def direct(a, b):
        log_p, log_q = jax.nn.log_softmax(a), jax.nn.log_softmax(b)
        return (0.5 * ((jnp.exp(log_p) - jnp.exp(log_q)) * (log_p - log_q)).sum(-1) * weights).sum()

    # Compiled: one program each costs less than their ops compiled one by one.
    want = jax.jit(jax.grad(direct, argnums=(0, 1)))(z1, z2)
    ours = jax.grad(lambda a, b: (rdrop.symmetric_kl(a, b) * weights).sum(), argnums=(0, 1))
    got = jax.jit(ours)(z1, z2)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        assert np.abs(w).max() > 0.1
