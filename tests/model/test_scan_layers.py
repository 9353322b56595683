"""model.scan_layers: the layers as one nn.scan over parameters stacked on a layer axis
(transformer/model/layer_stack.py), against the unrolled layers: the same parameters, logits,
training steps in each parallel mode and decoding outputs; the weight-decay mask."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.compiles import DEFAULT_GENERATORS
from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model, tiny_parallel
from transformer.decoding import DecodeOptions, beam_search, greedy_search
from transformer.model import (
    Transformer,
    abstract_params,
    init_params,
    logical_partition_specs,
    stack_layers,
    teacher_forced_logits,
    unstack_layers,
)
from transformer.training import optim, steps

LAYERS = {'num_encoder_layers': 3, 'num_decoder_layers': 2}


def _pair(**overrides) -> tuple[Transformer, Transformer]:
    unrolled = tiny_model(**LAYERS, **overrides)
    return unrolled, Transformer(dataclasses.replace(unrolled.config, scan_layers=True))


def _random_params(unrolled: Transformer, seed: int = 0) -> dict:
    """Random values on the unrolled model's parameter tree (tests/random_params.py): the
    equalities below hold for any values, and the real initialisers, run op by op, cost
    seconds per model on a CPU (their scanned layout is the test just below's)."""
    return fill_random(abstract_params(unrolled), seed)


def test_stack_and_unstack_are_inverse_and_init_is_the_unrolled_models():
    unrolled, scanned = _pair()
    params = init_params(unrolled, jax.random.key(0))
    stacked = init_params(scanned, jax.random.key(0))
    assert set(stacked) == {'encoder_layers', 'decoder_layers', 'shared_embedding'}
    kernel = stacked['encoder_layers']['ffn']['wi']['kernel']
    assert kernel.shape == (3, 32, 64)
    np.testing.assert_array_equal(kernel[2], params['encoder_layer_2']['ffn']['wi']['kernel'])
    for a, b in zip(jax.tree.leaves(unstack_layers(stacked)), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(stack_layers(params)) == jax.tree.structure(stacked)
    specs = logical_partition_specs(scanned)
    assert tuple(specs['decoder_layers']['ffn']['wi']['kernel']) == ('layers', 'embed', 'mlp')


@pytest.mark.slow
@pytest.mark.parametrize(
    'overrides',
    [
        pytest.param({}, marks=pytest.mark.long),
        {'positions': 'rope', 'norm': 'rms_norm', 'qk_norm': True, 'num_kv_heads': 2},
    ],
)
def test_logits_and_decoding_equal_the_unrolled_models(overrides):
    """Teacher-forced logits, greedy and beam outputs (the batch shrinking as examples
    finish, so the scanned cache's rows are gathered) equal the unrolled model's (its searches
    on the whole batch: one loop to compile, where shrinking compiles one a batch size).

    The paper's parts (no overrides) are in the long tier: the scanned model's forward pass is
    checked by test_attention_maps_of_a_scanned_model_are_the_unrolled_ones and
    test_gradients_equal_the_unrolled_models, its greedy search by
    test_checkpoints_of_either_layout_resume_decode_average_and_export, and the shrinking
    searches by the later parts' case, which runs the same scan and cache code."""
    unrolled, scanned = _pair(**overrides)
    # Random values (as the initialiser's: the beams still finish early and shrink the batch)
    # cost no op-by-op run of the initialisers.
    params = _random_params(unrolled, seed=1)
    stacked = stack_layers(params)
    rng = np.random.default_rng(2)
    inputs = jnp.asarray(rng.integers(2, 32, (6, 7))).at[:, 6].set(1)
    targets = jnp.asarray(rng.integers(2, 32, (6, 5)))
    # Compiled: op by op, the scan's layers cost more than the two programs' compilation.
    logits = jax.jit(teacher_forced_logits, static_argnums=0)
    np.testing.assert_allclose(
        logits(scanned, stacked, inputs, targets),
        logits(unrolled, params, inputs, targets),
        atol=1e-5,
    )
    # min_stage_batch=2: the scanned searches shrink their batch from 6 rows to 3 (and gather
    # the cache's rows, below the scanned cache's layer axis) as examples finish.
    options = DecodeOptions(max_decode_len=9)
    for search in (greedy_search, lambda *a, **k: beam_search(*a, beam_size=3, **k)[0]):
        ours = search(scanned, stacked, inputs, options=options, min_stage_batch=2)
        theirs = search(unrolled, params, inputs, options=options, min_stage_batch=6)
        np.testing.assert_array_equal(ours, theirs)


MODES = {
    'sharding1': ('sharding', 1, {}),
    'sharding2': ('sharding', 2, {}),
    'pmap2': ('pmap', 2, {}),
    'fsdp4': ('sharding', 4, {'fsdp': True}),
    'model4': ('sharding', 4, {'model_parallelism': 2}),
}
# In the suite, the modes whose step does more than one device's with the layer axis:
# replicas kept by pmap, and the stacked parameters sharded over fsdp's and the model's axes
# at once (one program: ('data': 2, 'model': 2), fsdp on; 4 devices shard every axis as 8
# would, and the step compiles in about a quarter less time than on 8), with the
# policies the gradient test below leaves out. The others are in the long tier: fsdp4 and
# model4 each shard over one of the merged case's axes; one device's step under 'none' and
# 'full' repeats test_gradients_equal_the_unrolled_models (the same loss and gradients,
# compiled once each) and test_stacked_norm_scales_and_biases_do_not_decay (the update's
# mask); two data-parallel devices split the batch of a replicated state, as
# tests/training/test_parallel.py's data-parallel cases check for the unrolled step.
SUITE_MODES = {'fsdp_model4': ('sharding', 4, {'fsdp': True, 'model_parallelism': 2})}
SUITE = [('pmap2', 'dots'), ('fsdp_model4', 'attention')]
LONG = [(m, p) for m in MODES for p in ('none', 'full', 'dots', 'attention') if (m, p) not in SUITE]


@pytest.mark.slow
def test_a_training_step_equals_the_unrolled_models():
    """Dropout off: the same loss and, unstacked, the same parameters after two steps as the
    unrolled model's on one device without remat, in pmap mode on 2 devices with the 'dots'
    policy and sharded over ('data': 2, 'model': 2), fsdp on, with the 'attention' policy."""
    for mode, remat in SUITE:
        _assert_the_same_two_steps(*(MODES | SUITE_MODES)[mode], remat)


@pytest.mark.long
@pytest.mark.parametrize('mode, remat', LONG)
def test_every_mode_and_remat_policy_steps_as_the_unrolled_model(mode, remat):
    _assert_the_same_two_steps(*MODES[mode], remat)


def _assert_the_same_two_steps(mode: str, devices: int, layout: dict, remat: str) -> None:
    scanned_losses, scanned_params = _two_steps(mode, devices, layout, remat, scan=True)
    losses, params = _unrolled_two_steps()
    np.testing.assert_allclose(scanned_losses, losses, rtol=1e-6)
    for a, b in zip(scanned_params, params, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@functools.cache
def _unrolled_two_steps() -> tuple[list[float], list[np.ndarray]]:
    """The reference of every mode and policy, compiled once a process: the unrolled model's
    steps on one device without remat. (A scanned step gave the bits of the unrolled one in
    its own mode and policy; one device's loss differed from 8 devices' by 2e-7 of itself.)"""
    return _two_steps('sharding', 1, {}, 'none', scan=False)


def _two_steps(mode: str, devices: int, layout: dict, remat: str, scan: bool):
    """(losses, parameter leaves unstacked) after two steps from one random tree (the
    initialisers' compilation costs seconds a layout)."""
    params = _random_params(tiny_model(**LAYERS))
    model = tiny_model(**LAYERS, remat=remat, scan_layers=scan)
    par, model, tx = tiny_parallel(jax.devices('cpu')[:devices], mode, model=model, **layout)
    start = stack_layers(params) if scan else params

    def init():
        return steps.TrainState(jnp.array(0, jnp.int32), start, tx.init(start))

    state = par.put_state(par.init_state(init))
    losses = []
    for step in range(2):
        state, sums = par.train_step(state, packed_batch(step), jax.random.key(1))
        losses.append(float(np.asarray(jax.device_get(sums['loss'])).reshape(-1)[0]))
    params = unstack_layers(jax.device_get(par.global_state(state).params))
    return losses, jax.tree.leaves(params)


def test_stacked_norm_scales_and_biases_do_not_decay():
    """optim.decays keys on a parameter's axes: the stacked layers' leading axis is not one."""
    unrolled, _ = _pair(norm='rms_norm')
    params = _random_params(unrolled)
    mask, stacked_mask = optim.decays(params), optim.decays(stack_layers(params))
    for stack in ('encoder', 'decoder'):
        assert jax.tree.leaves(stacked_mask[f'{stack}_layers']) == jax.tree.leaves(
            mask[f'{stack}_layer_0']
        )
    assert not stacked_mask['encoder_layers']['ffn_norm']['scale']
    assert stacked_mask['encoder_layers']['ffn']['wi']['kernel']


def test_the_scanned_step_holds_one_layers_program_whatever_the_depth(monkeypatch):
    """The lowered train step's op histogram (tests/model/snapshots.py): a scanned 4 + 4
    model's equals a scanned 2 + 2 model's; the unrolled one grows with depth (twice the
    layers: over 1.9 times the products). Lowering an unrolled 6 + 6 model would take longer
    and show the same."""
    from tests.model import snapshots

    for layers in (2, 4):
        for scan in (False, True):
            fields = {'num_encoder_layers': layers, 'num_decoder_layers': layers}
            monkeypatch.setitem(
                snapshots.CASES, f'{layers}_{scan}', {**fields, 'scan_layers': scan}
            )
    assert snapshots.op_histogram('4_True') == snapshots.op_histogram('2_True')
    unrolled, deeper = snapshots.op_histogram('2_False'), snapshots.op_histogram('4_False')
    assert deeper['stablehlo.dot_general'] > 1.9 * unrolled['stablehlo.dot_general']


@pytest.mark.slow
def test_checkpoints_of_either_layout_resume_decode_average_and_export(run_dir, tmp_path):
    """A run trained unrolled for 4 steps (conftest's tiny run, copied) resumes scanned to 6
    (parameters and Adam state converted on restore); each checkpoint loads in either layout,
    the two averaged across layouts equal the per-layer average, the exports read the
    per-layer tree, and evaluate's greedy outputs agree in either layout."""
    import shutil

    from tests.tiny_run import DECODE_BATCH, tiny_run_config
    from transformer import evaluate
    from transformer.checkpoint import load_model
    from transformer.commands import export
    from transformer.commands import train as trainer

    run = str(tmp_path / 'run')
    shutil.copytree(run_dir, run)  # conftest's copy is shared by this process's tests
    config = tiny_run_config(6)
    config.model.scan_layers = True
    resumed = {}
    # On one device: the conversion on restore is the same on any number, and one device's
    # step compiles by the cheaper generators (tests/compiles.py).
    cpu = jax.devices('cpu')[:1]
    trainer.train_and_evaluate(config, run, devices=cpu, on_step=resumed.__setitem__)
    assert sorted(resumed) == [5, 6] and np.isfinite(resumed[6]['loss'])
    per_layer = {}
    for step in (4, 6):
        params = load_model(run, step=step, scan_layers=False)[3]
        stacked = load_model(run, step=step, scan_layers=True)[3]
        assert 'encoder_layer_0' in params and 'encoder_layers' in stacked
        for a, b in zip(
            jax.tree.leaves(unstack_layers(stacked)), jax.tree.leaves(params), strict=True
        ):
            np.testing.assert_array_equal(a, b)
        per_layer[step] = params
    _, _, _, averaged, steps_loaded = load_model(run, step=6, average_last=2)  # the run: scanned
    assert steps_loaded == [4, 6]
    mean = jax.tree.map(lambda a, b: (np.float64(a) + b) / 2, per_layer[4], per_layer[6])
    for a, b in zip(jax.tree.leaves(unstack_layers(averaged)), jax.tree.leaves(mean), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    _, _, model, exported, _ = export.load_run(run, 6, 1)
    assert not model.config.scan_layers and 'decoder_layer_0' in exported
    written = []
    # The checkpoint's greedy outputs in either layout, through evaluate: a few lines (the
    # searches' parity on random parameters: test_logits_and_decoding_equal_the_unrolled_models)
    # in a batch of DECODE_BATCH rows, whose search compiles one loop (eval.batch_size's 16: two).
    for flag in ('--scan_layers', '--noscan_layers'):
        out = tmp_path / f'{flag}.txt'
        args = [f'--workdir={run}', '--step=6', f'--output={out}', flag, '--beam_size=1']
        with pytest.raises(SystemExit) as info:
            evaluate.cli(['evaluate', *args, '--max_examples=4', f'--batch_size={DECODE_BATCH}'])
        assert not info.value.code
        written.append(out.read_text())
    assert written[0] == written[1]


def test_attention_maps_of_a_scanned_model_are_the_unrolled_ones():
    from transformer.model import attention_maps

    unrolled, scanned = _pair()
    params = _random_params(unrolled, seed=3)
    inputs, targets = np.array([5, 6, 7, 1]), np.array([8, 9, 1])
    ours = attention_maps(scanned, stack_layers(params), inputs, targets)
    theirs = attention_maps(unrolled, params, inputs, targets)
    assert sorted(ours) == sorted(theirs) and len(ours) == 3 + 2 * 2
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value)


@pytest.mark.parametrize('remat', [pytest.param('none', marks=pytest.mark.long), 'full'])
def test_gradients_equal_the_unrolled_models(remat):
    """One batch's loss and gradients, dropout off, in float32 products: the scanned model's
    under ``remat`` equal the plain unrolled model's to 1e-6 (whose program compiles in less
    time than a rematerialised one). 'none' is in the long tier: 'full' differentiates the
    same scan of the same layers, each wrapped in `nn.remat`, and test_relative_positions.py's
    scanned case differentiates a scan without it."""
    unrolled, _ = _pair()
    _, scanned = _pair(remat=remat)
    params = _random_params(unrolled, seed=4)
    batch = {k: jnp.asarray(v) for k, v in packed_batch(0).items()}

    def grads(model, p):
        return jax.grad(lambda q: steps.loss_sums(q, batch, model, 0.1, None)[0])(p)

    # XLA's default CPU code generators, whose arithmetic the 1e-6 was set for (the older
    # ones the suite compiles one-device programs with: 7e-6, tests/conftest.py).
    compile = functools.partial(jax.jit, compiler_options=DEFAULT_GENERATORS)
    with jax.default_matmul_precision('float32'):
        ours = unstack_layers(compile(lambda p: grads(scanned, p))(stack_layers(params)))
        theirs = compile(lambda p: grads(unrolled, p))(params)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
