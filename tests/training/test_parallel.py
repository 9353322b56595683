"""Data parallelism (pmap / sharding == one device) and the tensor-parallel layout."""

import jax
import numpy as np
import pytest

from tests.compiles import compiled_programs
from tests.random_params import fill_random
from tests.shared_dirs import built_once
from tests.subprocess_env import repo_env, xla_flags
from tests.tiny_run import LEARNING_WARMUP, LEN, packed_batch, tiny_model, tiny_parallel
from transformer.configs import base
from transformer.model import abstract_params
from transformer.training import optim, parallel, steps


def _run(mode: str, devices, accum: int, num_steps: int = 3, **layout):
    # The warm-up under which the tiny model learns in 3 steps; tests/training/test_layouts.py
    # and `test_the_step_compiled_ahead_is_the_one_that_runs` build the same steps, which the
    # suite's compilation cache (tests/conftest.py) then compiles once for all of them.
    par, model, tx = tiny_parallel(
        devices, mode, accum_steps=accum, warmup_steps=LEARNING_WARMUP, **layout
    )
    state = par.put_state(
        par.init_state(lambda: steps.init_state(model, tx, jax.random.key(0), LEN))
    )
    losses = []
    for step in range(num_steps):
        state, sums = par.train_step(state, packed_batch(step), jax.random.key(1))
        sums = jax.device_get(sums)
        loss = np.asarray(sums['loss']).reshape(-1)[0] / np.asarray(sums['tokens']).reshape(-1)[0]
        losses.append(loss)
    return np.array(losses), jax.device_get(par.global_state(state).params), state


def _random_state(model, tx) -> steps.TrainState:
    """A fresh state of random parameters (tests/random_params.py), for the tests whose
    assertion holds for any values: compiling the real initialisers costs seconds a layout."""
    params = fill_random(abstract_params(model))
    return steps.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params))


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    """(losses, parameter leaves) of one device's 3 steps: run once for all pytest-xdist
    workers (tests/shared_dirs.py), which each read them from its .npz file."""

    def train(path):
        losses, params, _ = _run('sharding', jax.devices('cpu')[:1], accum=1)
        path.mkdir()
        np.savez(path / 'run.npz', losses, *jax.tree.leaves(params))

    with np.load(built_once(tmp_path_factory, 'parallel_reference', train) / 'run.npz') as run:
        return run['arr_0'], [run[f'arr_{i}'] for i in range(1, len(run.files))]


def _assert_same_training(got, reference) -> None:
    (losses, params), (ref_losses, ref_params) = got[:2], reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < losses[0]  # it learns: the comparison is not between frozen models
    for ref, value in zip(jax.tree.leaves(ref_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    'mode,num_devices,accum,chunk',
    [
        ('pmap', 8, 1, 0),
        # The same run as test_layouts_equal_one_device_and_hold_their_share's data-only
        # layout (sharding, 8 devices, no accumulation), which also checks its bytes.
        pytest.param('sharding', 8, 1, 0, marks=pytest.mark.long),
        # pmap with accumulation and the chunked loss: its mode is ('pmap', 8, 1, 0)'s, its
        # options ('sharding', 4, 2, 20)'s (the same 5 positions a chunk).
        pytest.param('pmap', 4, 2, 5, marks=pytest.mark.long),  # a device's micro-batch: 1 row
        ('sharding', 4, 2, 20),  # a micro-batch: 4 global rows; 5 positions a chunk
        # Accumulation on one device (long tier): ('sharding', 4, 2, 20) accumulates too.
        pytest.param('sharding', 1, 4, 0, marks=pytest.mark.long),
    ],
)
def test_data_parallel_equals_one_device(mode, num_devices, accum, chunk, reference):
    """Same global batch -> same losses and parameters after 3 steps on 1 or 8 devices, with
    or without gradient accumulation (the loss is normalised by the global token count). The
    accumulation over 4 data devices computes the chunked loss in both modes (pmap's in the
    long tier; ``chunk`` tokens: 5 of the 12 positions of every row at a time, the last chunk
    padded) and trains as one device with the full logits (that the config's key reaches the
    compiled step: `test_the_config_chooses_the_loss`)."""
    assert len(jax.devices('cpu')) == 8, 'conftest should give 8 CPU devices'
    got = _run(mode, jax.devices('cpu')[:num_devices], accum, loss_chunk_tokens=chunk)
    _assert_same_training(got, reference)


def _per_device_bytes(state, device) -> int:
    return sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(state.params)
        for shard in leaf.addressable_shards
        if shard.device == device
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    'model_parallelism,fsdp',
    # Both at once (long tier): each of its splits is checked by (2, False) or (1, True).
    [(1, False), (2, False), (1, True), pytest.param(2, True, marks=pytest.mark.long)],
    ids=str,
)
def test_layouts_equal_one_device_and_hold_their_share(model_parallelism, fsdp, reference):
    """data-only, data x model, FSDP and both on 8 devices train like 1 device, and each
    device holds the parameter bytes the layout implies: heads, d_ff and the vocabulary (32
    pieces: the axis divides them) split on 'model', d_model split on 'data' under FSDP."""
    got = _run('sharding', jax.devices('cpu'), 1, model_parallelism=model_parallelism, fsdp=fsdp)
    _assert_same_training(got, reference)
    specs = parallel.logical_specs(tiny_model(), optim.make_optimizer(base.get_config().opt, 32)[0])
    data_shards = 8 // model_parallelism
    expected = 0
    for spec, leaf in zip(
        jax.tree.leaves(specs.params, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)),
        jax.tree.leaves(got[1]),
        strict=True,
    ):
        divide = 1
        if {'heads', 'mlp', 'vocab'} & set(spec):
            divide *= model_parallelism
        if fsdp and 'embed' in spec:
            divide *= data_shards
        expected += leaf.nbytes // divide
    assert _per_device_bytes(got[2], jax.devices('cpu')[0]) == expected
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(got[1]))
    assert (expected < total) == (fsdp or model_parallelism > 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    'num_devices, accum', [(8, 1), (2, 2), pytest.param(2, 4, marks=pytest.mark.long)]
)
def test_accumulation_splits_every_micro_batch_over_all_data_devices(num_devices, accum):
    """In sharding mode each micro-step computes rows / (devices x A) rows on every device
    (read from the compiled step's [rows, T, V] logits), with no all-gather of the batch.
    A = 4 (long tier) runs the same scan over micro-batches as A = 2. A = 1 on 8 devices is
    the data-only layout's step of `test_layouts_equal_one_device_and_hold_their_share`
    (the same warm-up), which the suite's compilation cache compiles once for both."""
    import re

    from tests.tiny_run import ROWS, VOCAB

    devices = jax.devices('cpu')[:num_devices]
    par, model, tx = tiny_parallel(devices, accum_steps=accum, warmup_steps=LEARNING_WARMUP)
    state = par.abstract_state(lambda: steps.init_state(model, tx, jax.random.key(0), LEN))
    compiled = par.lower_step(state, par.put_batch(packed_batch(0)), jax.random.key(1)).compile()
    hlo = compiled.as_text()
    rows = {int(r) for r in re.findall(rf'f32\[(\d+),{LEN},{VOCAB}\]', hlo)}
    assert rows == {ROWS // (num_devices * accum)}
    assert 'all-gather' not in hlo


def test_layouts_the_model_cannot_take_fail_before_compiling():
    """A 'model' axis that does not divide heads or d_ff, FSDP over a data axis that does
    not divide d_model: one-line ValueErrors from the constructor."""
    tx, schedule = optim.make_optimizer(base.get_config().opt, d_model=32)
    kwargs = dict(model=tiny_model(), tx=tx, schedule=schedule, label_smoothing=0.1)
    with pytest.raises(ValueError, match=r'model_parallelism=8 does not divide model.num_heads=4'):
        parallel.Parallel(
            'sharding', accum_steps=1, model_parallelism=8, devices=jax.devices('cpu'), **kwargs
        )
    with pytest.raises(ValueError, match='fsdp shards model.d_model=32 over 6'):
        parallel.Parallel(
            'sharding', accum_steps=1, fsdp=True, devices=jax.devices('cpu')[:6], **kwargs
        )
    with pytest.raises(ValueError, match="need train.parallelism='sharding'"):
        parallel.Parallel('pmap', accum_steps=1, fsdp=True, devices=jax.devices('cpu'), **kwargs)


@pytest.mark.parametrize(
    'grid, want',
    [
        ([[0, 1]], {0: (0, 1), 1: (0, 1)}),  # 2 processes x 1 device, model axis of 2
        ([[0], [0], [1], [1]], {0: (0, 2), 1: (1, 2)}),  # 2 x 2, data only
        ([[0, 0], [1, 1]], {0: (0, 2), 1: (1, 2)}),  # 2 x 2, model axis inside each process
        ([[0, 1], [2, 3]], {0: (0, 2), 1: (0, 2), 2: (1, 2), 3: (1, 2)}),  # 4 x 1, model of 2
        ([[1], [0]], {1: (0, 2), 0: (1, 2)}),  # the mesh's order, not the process index
    ],
)
def test_data_groups_follow_the_mesh(grid, want):
    """Processes that hold the same data indices feed the same rows; the block a process
    feeds is where its data indices sit on the mesh."""
    assert parallel.data_groups(np.array(grid)) == want


@pytest.mark.parametrize('grid', [[[0, 0], [0, 1], [1, 1]], [[0], [1], [0], [1]]])
def test_layouts_no_split_of_the_batch_fits_are_refused(grid):
    """2 processes x 3 devices with a model axis of 2 (process 0 holds data indices 0-1,
    process 1 holds 1-2); data indices that interleave between processes."""
    with pytest.raises(ValueError, match=r'no split of the batch fits \(process 0: \[0, '):
        parallel.data_groups(np.array(grid))


def test_a_batch_of_other_than_the_configured_rows_raises():
    """The global batch is the configured one: a process feeding another number of rows
    raises instead of training on a smaller batch."""
    par, _, _ = tiny_parallel(jax.devices('cpu')[:2], batch_size=16)
    assert (par.data_group, par.data_groups) == (0, 1)
    with pytest.raises(ValueError, match='fed 8 rows; the global batch of 16 needs 16'):
        par.put_batch(packed_batch(0))


@pytest.mark.slow
def test_sharding_mode_splits_heads_on_the_model_axis():
    """With a 'model' axis of 2, q/k/v kernels are split on N and out kernels on N."""
    mesh = parallel.make_mesh(2, jax.devices('cpu')[:4])
    model = tiny_model()
    tx, _ = optim.make_optimizer(base.get_config().opt, d_model=32)
    state = _random_state(model, tx)
    shardings = parallel.state_shardings(mesh, parallel.logical_specs(model, tx))
    attn = shardings.params['encoder_layer_0']['self_attention']
    assert attn['query']['kernel'].spec == jax.sharding.PartitionSpec(None, 'model', None)
    assert attn['out']['kernel'].spec == jax.sharding.PartitionSpec('model', None, None)
    mu = shardings.opt_state[-1][0].mu['encoder_layer_0']['self_attention']['key']['kernel']
    assert mu.spec == jax.sharding.PartitionSpec(None, 'model', None)
    placed = jax.device_put(state, shardings)
    kernel = placed.params['encoder_layer_0']['self_attention']['query']['kernel']
    assert kernel.addressable_shards[0].data.shape == (32, 2, 8)  # half of the 4 heads


@pytest.mark.parametrize(
    'overrides',
    [{}, {'share_embeddings': 'none', 'pre_layer_norm': True}, {'share_embeddings': 'target'}],
)
def test_every_parameter_declares_its_logical_axes(overrides):
    """Each parameter names every one of its axes where it is created, so a renamed layer
    cannot silently fall out of the tensor-parallel layout; heads and d_ff map to 'model'."""
    import dataclasses

    from flax import linen as nn

    from transformer.model import Transformer, variants

    model = Transformer(dataclasses.replace(tiny_model().config, **overrides))
    specs = parallel.logical_specs(model, optim.make_optimizer(base.get_config().opt, 32)[0])
    tokens = np.ones((1, 4), np.int32)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens, tokens))['params']
    flat_specs = jax.tree_util.tree_leaves_with_path(
        specs.params, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    flat_shapes = jax.tree.leaves(shapes)
    assert len(flat_specs) == len(flat_shapes) > 0
    for (path, spec), shape in zip(flat_specs, flat_shapes, strict=True):
        assert len(spec) == len(shape.shape) and None not in spec, (path, spec)
    mesh = parallel.make_mesh(2, jax.devices('cpu')[:4])
    shardings = parallel.state_shardings(mesh, specs)
    split = {
        jax.tree_util.keystr(path)
        for path, s in jax.tree_util.tree_leaves_with_path(shardings.params)
        if 'model' in s.spec
    }
    # The feed-forward's kernels, by the names its variant declares (model/variants.py).
    ffn = variants.chosen(model.config, 'ffn').weights(model.config)
    kernels = [k.split('/') for k in ffn if k.endswith('/kernel')]
    keys = ["['encoder_layer_0']['ffn']" + ''.join(f"['{p}']" for p in k) for k in kernels]
    assert keys and set(keys) <= split, (keys, split)
    assert all('embedding' not in name and 'norm' not in name for name in split)


def test_fetch_raises_the_error_of_a_computation_that_ran_out_of_memory():
    """`fetch` of an output whose computation failed for want of memory raises that
    error; ``jax.device_get`` / ``int()`` of it wait for ever on jaxlib's CPU client (in a
    subprocess on the CPU, so that a regression fails on the timeout instead of hanging the
    suite)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from transformer.backends.fetch import fetch
        shape = (2 * 10**9, 10**5)  # 8e14 bytes: more than any address space
        step = jax.jit(lambda k: (jnp.zeros((), jnp.int32), jax.random.normal(k, shape)))
        small, _ = step(jax.random.key(0))
        try:
            fetch(small)
        except jax.errors.JaxRuntimeError as e:
            print('raised:', str(e).splitlines()[0])
        """
    )
    env = repo_env(JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(1))
    done = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == (
        'raised: RESOURCE_EXHAUSTED: Out of memory allocating 800000000000000 bytes.'
    )


@pytest.mark.parametrize('chunk_tokens, scans', [(0, 0), (40, 1)])
def test_the_config_chooses_the_loss(chunk_tokens, scans):
    """Parallel.from_config hands train.loss_chunk_tokens to the step: the chunked loss is the
    one scan of this step's program (no gradient accumulation), the full logits have none."""
    config = base.get_config()
    config.train.batch_size, config.train.loss_chunk_tokens = 8, chunk_tokens
    model = tiny_model()
    tx, schedule = optim.make_optimizer(config.opt, d_model=32)
    par = parallel.Parallel.from_config(config, model, tx, schedule, jax.devices('cpu')[:1])
    state = par.abstract_state(lambda: steps.init_state(model, tx, jax.random.key(0), LEN))
    program = str(jax.make_jaxpr(par._step)(state, packed_batch(0), jax.random.key(1)))
    assert program.count('scan[') == scans


def test_the_step_compiled_ahead_is_the_one_that_runs():
    """`compile_step` compiles once (XLA's memory analysis is read from it before the first
    step); `train_step` then runs that executable and compiles nothing again."""
    # The reference run's step (`_reference`): compiled once for both through the cache.
    par, model, tx = tiny_parallel(jax.devices('cpu')[:1], warmup_steps=LEARNING_WARMUP)
    state = jax.device_put(_random_state(model, tx), par.shardings)
    with compiled_programs() as compiles:
        compiled = par.compile_step(state, par.put_batch(packed_batch(0)), jax.random.key(1))
        assert [name for name in compiles if 'train_step' in name] == ['jit(train_step)']
        assert compiled.memory_analysis().temp_size_in_bytes > 0
        for step in range(2):
            state, sums = par.train_step(state, packed_batch(step), jax.random.key(1))
        assert jax.device_get(sums['tokens']) > 0
        assert par.compile_step(state, par.put_batch(packed_batch(0)), None) is compiled
    assert [name for name in compiles if 'train_step' in name] == ['jit(train_step)']
