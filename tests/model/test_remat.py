"""model.remat (transformer/model/remat.py): every policy computes the plain model's loss
and gradients, keeps its parameter tree and decoding, and changes what XLA keeps."""

import functools

import jax
import numpy as np
import optax
import pytest

from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model
from transformer import run_changes, rundir, schema
from transformer.model import (
    abstract_params,
    decode_step,
    encode,
    init_cache,
    remat_compiler_options,
)
from transformer.model.remat import REMAT_POLICIES
from transformer.training import footprint, parallel, steps

POLICIES = [p for p in REMAT_POLICIES if p != 'none']


def _model(policy: str):
    return tiny_model(remat=policy)


@functools.cache
def _one_step(policy: str, mode: str):
    """(loss sums, gradients) of one train step on the 8 CPU devices;
    plain SGD at rate 1 makes the step's parameter change the negated gradient."""
    model = _model(policy)
    tx = optax.sgd(1.0)
    layout = {'model_parallelism': 2} if mode == 'sharding' else {}
    par = parallel.Parallel(
        mode,
        model=model,
        tx=tx,
        schedule=lambda step: 1.0,
        label_smoothing=0.1,
        accum_steps=1,
        devices=jax.devices('cpu'),
        **layout,
    )
    before = fill_random(abstract_params(model))
    state = steps.TrainState(step=np.int32(0), params=before, opt_state=tx.init(before))
    state = par.put_state(jax.device_put(state, par.shardings))
    batch = par.put_batch(packed_batch(0))
    state, sums = par.train_step(state, batch, jax.random.key(1))
    after = jax.device_get(par.global_state(state).params)
    grads = jax.tree.map(lambda b, a: b - a, before, after)
    return jax.device_get(sums), grads


def _assert_same_step(got, want) -> None:
    (sums, grads), (ref_sums, ref_grads) = got, want
    np.testing.assert_allclose(sums['loss'], ref_sums['loss'], rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


# 'full' in the suite; the other policies are the same `nn.remat` wrapper with another
# policy function, and the suite runs each in a training step equal to its unrolled model's
# (tests/model/test_scan_layers.py: 'dots' in pmap mode on 2 devices, 'attention' with fsdp and
# the model axis on 8): in the long tier.
MESH_POLICIES = [p if p == 'full' else pytest.param(p, marks=pytest.mark.long) for p in POLICIES]


@pytest.mark.slow
@pytest.mark.parametrize('policy', MESH_POLICIES)
def test_each_policy_gives_the_plain_models_loss_and_gradients_on_a_mesh(policy):
    """Packed rows, ('data': 4, 'model': 2): the summed loss to 1e-6 and every gradient (of
    the token-normalised loss) to 1e-6 absolute and 1e-5 relative, float32."""
    _assert_same_step(_one_step(policy, 'sharding'), _one_step('none', 'sharding'))


@pytest.mark.long
def test_a_policy_gives_the_plain_models_gradients_in_pmap_mode():
    """In the long tier, a second parallel mode of the same wrapped layers: a policy's loss
    and gradients equal the plain model's on a mesh
    (test_each_policy_gives_the_plain_models_loss_and_gradients_on_a_mesh), and a pmap step
    of the 'dots' policy runs and equals the unrolled model's step (tests/model/
    test_scan_layers.py: test_a_training_step_equals_the_unrolled_models, its pmap case)."""
    _assert_same_step(_one_step('dots', 'pmap'), _one_step('none', 'pmap'))


def _temp_bytes(policy: str) -> tuple[int, int | None]:
    """XLA's temporary bytes of the train step of a 2 + 2-layer model whose activations
    outweigh its parameters (16 rows x 64 tokens, width 32, d_ff 256) on one CPU device: as
    `Parallel.compile_step` compiles it, and as its lowered program compiles without
    `remat_compiler_options` (None for a policy that has none: the same program)."""
    model = tiny_model(remat=policy, d_ff=256, num_encoder_layers=2, num_decoder_layers=2)
    tx = optax.sgd(1.0)
    par = parallel.Parallel(
        'sharding',
        model=model,
        tx=tx,
        schedule=lambda step: 1.0,
        label_smoothing=0.0,
        accum_steps=1,
        devices=jax.devices('cpu')[:1],
    )
    params = fill_random(abstract_params(model))
    state = steps.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params))
    state = jax.device_put(state, par.shardings)
    rows = [packed_batch(seed) for seed in (0, 1)]
    batch = {k: np.tile(np.concatenate([r[k] for r in rows]), (1, 5))[:, :64] for k in rows[0]}
    args = state, par.put_batch(batch), jax.random.key(1)
    trained = footprint.step_bytes(par.compile_step(*args))['temp']
    if remat_compiler_options(policy, 'cpu') is None:
        return trained, None
    return trained, footprint.step_bytes(par.lower_step(*args).compile())['temp']


@pytest.mark.slow
def test_full_recomputation_keeps_under_half_the_temporaries_on_a_cpu():
    """What the memory check reads (`footprint.step_bytes` of the compiled step) follows the
    policy: 'full' keeps under half of the plain step's temporaries (the other policies:
    docs/experiments.md). Without `remat_compiler_options` XLA's CPU compiler computes the
    recomputation in the forward pass and 'full' keeps about as many as 'none' (the first
    assertion fails)."""
    plain, _ = _temp_bytes('none')
    full, full_without_options = _temp_bytes('full')
    assert full < plain / 2, (full, plain)
    assert full_without_options > 2 * full


def test_the_cpu_options_are_for_a_policy_on_a_cpu_only():
    assert remat_compiler_options('none', 'cpu') is None
    assert remat_compiler_options('full', 'gpu') is None
    assert remat_compiler_options('full', 'cpu') == {
        'xla_disable_hlo_passes': 'cse_barrier_expander'
    }


def test_every_policy_keeps_the_parameter_tree():
    shapes = lambda policy: jax.tree.map(lambda x: x.shape, abstract_params(_model(policy)))  # noqa: E731
    for policy in POLICIES:
        assert shapes(policy) == shapes('none'), policy


@pytest.mark.slow
def test_decoding_is_unchanged():
    """A cached decoding step's logits with model.remat='full' equal the plain model's bit
    for bit: without a gradient the wrapper computes the same."""
    params = fill_random(abstract_params(_model('none')))
    inputs = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)
    last = np.array([0, 0], np.int32)

    @functools.partial(jax.jit, static_argnums=0)
    def two_steps(model, params):
        encoded = encode(model, params, inputs)
        cache = init_cache(model, params, encoded, inputs, 3)
        first, cache = decode_step(model, params, cache, encoded, inputs, last)
        second, _ = decode_step(model, params, cache, encoded, inputs, first.argmax(-1))
        return first, second

    got, want = two_steps(_model('full'), params), two_steps(_model('none'), params)
    for step in range(2):
        np.testing.assert_array_equal(np.asarray(got[step]), np.asarray(want[step]))


def test_an_unknown_policy_is_one_line():
    with pytest.raises(ValueError, match=r"^model.remat='layer' must be one of 'none', 'full'"):
        tiny_model(remat='layer')


def test_a_resume_may_change_the_policy(tmp_path):
    workdir = str(tmp_path / 'run')
    (tmp_path / 'run' / 'vocab').mkdir(parents=True)
    open(rundir.path(workdir, rundir.VOCAB_FILE), 'wb').close()
    rundir.write_config(workdir, schema.parse(schema.default_config()))
    changed = schema.default_config()
    changed.model.remat = 'full'
    changes = run_changes.resume_changes(workdir, schema.parse(changed))
    assert changes == [('model.remat', 'none', 'full')]
