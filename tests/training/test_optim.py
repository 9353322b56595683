"""The schedule and optimiser of Sec. 5.3."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import schema
from transformer.configs import base
from transformer.training import optim


@pytest.mark.parametrize('step', [1, 10, 3999, 4000, 4001, 100_000])
def test_rsqrt_schedule_matches_paper_formula(step):
    """lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    schedule = optim.rsqrt_schedule(d_model=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    np.testing.assert_allclose(schedule(step - 1), expected, rtol=1e-6)


def test_rsqrt_schedule_peaks_at_warmup():
    """The learning rate rises until warmup_steps and falls after it."""
    schedule = optim.rsqrt_schedule(d_model=512, warmup_steps=4000)
    values = np.array([schedule(count) for count in range(0, 8000, 50)])
    assert int(np.argmax(values)) * 50 + 1 in range(3951, 4051)


def test_adam_first_step_uses_paper_betas_and_epsilon():
    """Adam's first update is -lr * g / (|g| + eps) whatever beta1 / beta2 are (bias
    correction), and the config's betas and eps are the ones used."""
    opt = base.get_config().opt
    tx, schedule = optim.make_optimizer(opt, d_model=512)
    params = {'w': jnp.array([1.0, -2.0, 3.0])}
    grads = {'w': jnp.array([0.5, -1e-3, 0.0])}
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    lr = schedule(0)
    expected = -lr * grads['w'] / (jnp.abs(grads['w']) + opt.eps)
    np.testing.assert_allclose(updates['w'], expected, rtol=1e-6)
    adam_state = state[-1][0]
    np.testing.assert_allclose(adam_state.nu['w'], (1 - opt.b2) * grads['w'] ** 2, rtol=1e-6)
    np.testing.assert_allclose(adam_state.mu['w'], (1 - opt.b1) * grads['w'], rtol=1e-6)


def test_bad_schedule_name_is_a_clear_error():
    opt = base.get_config().opt
    opt.schedule = 'cosine'
    with pytest.raises(
        ValueError, match=r"one of \('rsqrt', 'constant', 'inverse_sqrt'\), got 'co"
    ):
        optim.make_optimizer(opt, d_model=512)


def test_cooldown_ramps_the_schedule_linearly_to_zero_at_the_last_step():
    """opt.cooldown_steps: the rsqrt value until the cool-down, then times (T - count) / C."""
    opt = base.get_config().opt
    opt.warmup_steps, opt.cooldown_steps = 100, 400
    _, schedule = optim.make_optimizer(opt, d_model=64, num_steps=1000)
    plain = optim.rsqrt_schedule(d_model=64, warmup_steps=100)
    for count in [0, 99, 599, 600]:
        np.testing.assert_allclose(schedule(count), plain(count), rtol=1e-6)
    for count in [700, 950, 999]:
        np.testing.assert_allclose(schedule(count), plain(count) * (1000 - count) / 400, rtol=1e-6)
    assert float(schedule(1000)) == 0.0


def test_cooldown_needs_the_run_length_and_fits_in_it():
    opt = base.get_config().opt
    opt.cooldown_steps = 500
    with pytest.raises(ValueError, match='train.num_steps'):
        optim.make_optimizer(opt, d_model=64)
    with pytest.raises(ValueError, match='cooldown_steps must be in'):
        optim.make_optimizer(opt, d_model=64, num_steps=100)


@pytest.mark.parametrize(
    ('count', 'expected'),
    [
        (0, 1e-7),  # the first update: warmup_init_lr
        (1, 1e-7 + (5e-3 - 1e-7) / 2000),
        (1000, (1e-7 + 5e-3) / 2),  # half-way up the line
        (2000, 5e-3),  # the peak, where the two pieces meet
        (8000, 5e-3 / 2),  # 4 x warm-up: peak x sqrt(2000 / 8000)
    ],
)
def test_inverse_sqrt_is_fairseqs_schedule(count, expected):
    """fairseq's inverse_sqrt with its Multi30k recipe's settings (--warmup-init-lr 1e-7,
    --lr 0.005, --warmup-updates 2000): lr = init + count x (peak - init) / warmup during the
    warm-up, peak x sqrt(warmup / count) after; count = updates already taken."""
    opt = base.get_config().opt
    opt.schedule, opt.lr_scale, opt.warmup_steps, opt.warmup_init_lr = (
        'inverse_sqrt',
        5e-3,
        2000,
        1e-7,
    )
    _, schedule = optim.make_optimizer(opt, d_model=512)  # d_model plays no part
    np.testing.assert_allclose(schedule(count), expected, rtol=1e-6)


def test_inverse_sqrt_takes_the_cooldown_as_the_others():
    opt = base.get_config().opt
    opt.schedule, opt.lr_scale, opt.warmup_steps, opt.cooldown_steps = (
        'inverse_sqrt',
        1e-3,
        100,
        200,
    )
    _, schedule = optim.make_optimizer(opt, d_model=64, num_steps=1000)
    plain = optim.inverse_sqrt_schedule(1e-3, 100)
    np.testing.assert_allclose(schedule(400), plain(400), rtol=1e-6)
    np.testing.assert_allclose(schedule(900), plain(900) * 100 / 200, rtol=1e-6)


def test_warmup_init_lr_belongs_to_inverse_sqrt():
    """A first-update rate the schedule would not read is a one-line config error."""
    config = base.get_config()
    config.opt.warmup_init_lr = 1e-7
    with pytest.raises(schema.ConfigError, match="read by opt.schedule='inverse_sqrt' only"):
        schema.parse(config)
    config.opt.schedule = 'inverse_sqrt'
    assert schema.parse(config).opt.warmup_init_lr == 1e-7


def test_weight_decay_is_decoupled_and_spares_biases_and_norms():
    """opt.weight_decay: with a zero gradient Adam's update is 0, so the whole update is the
    decay, -lr x wd x w, on matrices only (biases, layer-norm scales kept); 0 keeps Adam's
    state."""
    opt = base.get_config().opt
    opt.schedule, opt.lr_scale = 'constant', 0.5
    params = {'kernel': jnp.full((2, 3), 2.0), 'bias': jnp.full((3,), 2.0), 'scale': jnp.ones(3)}
    plain, _ = optim.make_optimizer(opt, d_model=8)
    opt.weight_decay = 0.1
    tx, _ = optim.make_optimizer(opt, d_model=8)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(updates['kernel'], -0.5 * 0.1 * 2.0, rtol=1e-6)
    assert not np.any(updates['bias']) and not np.any(updates['scale'])
    assert optim.decays({'embedding': jnp.ones((5, 2)), 'b': jnp.ones(2)}) == {
        'embedding': True,
        'b': False,
    }
    adam = optax.chain(optax.adam(optax.constant_schedule(0.5)))  # earlier runs' state
    assert jax.tree.structure(plain.init(params)) == jax.tree.structure(adam.init(params))
