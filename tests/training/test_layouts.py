"""The sharding mode's compiled train step on the 8 CPU devices: the state keeps its layout
(explicit in / out shardings, donation), the activations are constrained by the rules table,
and the collectives each layout runs are counted, so a change that adds a reshard fails."""

import functools
import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.random_params import fill_random
from tests.tiny_run import LEARNING_WARMUP, packed_batch, tiny_parallel
from transformer import decoding
from transformer.model import abstract_params
from transformer.training import parallel, steps
from transformer.training.decode_layout import training_layout

COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute', 'all-to-all')
LAYOUTS = {
    'data': {},
    'fsdp': {'fsdp': True},
    'model 2': {'model_parallelism': 2},
}


def collective_counts(hlo: str) -> dict[str, int]:
    """How many of each collective a compiled program's HLO text holds."""
    return {kind: len(re.findall(rf'\s{kind}(?:-start)?\(', hlo)) for kind in COLLECTIVES}


@functools.cache
def _compiled(layout: str):
    """(Parallel, state, batch, compiled step) of the tiny model in ``layout`` on 8 devices.
    Its optimizer is tests/training/test_parallel.py's runs': the step is theirs, compiled
    once for both files through the suite's compilation cache (tests/conftest.py)."""
    par, model, tx = tiny_parallel(
        jax.devices('cpu'), warmup_steps=LEARNING_WARMUP, **LAYOUTS[layout]
    )
    params = fill_random(abstract_params(model))
    state = steps.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params))
    state = jax.device_put(state, par.shardings)
    batch = par.put_batch(packed_batch(0))
    return par, state, batch, par.compile_step(state, batch, jax.random.key(1))


def _same(shardings, want) -> bool:
    pairs = zip(jax.tree.leaves(shardings), jax.tree.leaves(want), strict=True)
    return all(s.is_equivalent_to(w, 4) or s == w for s, w in pairs)


@pytest.mark.slow
@pytest.mark.parametrize('layout', ['fsdp', 'model 2'])
def test_the_state_keeps_its_layout_step_after_step_and_the_old_one_is_freed(layout):
    """Explicit in / out shardings: the compiled step takes and gives the state's layout,
    frees the donated state, and refuses a state in another layout."""
    par, state, batch, compiled = _compiled(layout)
    state = jax.device_put(jax.device_get(state), par.shardings)  # the cached one stays
    assert _same(compiled.input_shardings[0][0], par.shardings)
    assert _same(compiled.output_shardings[0], par.shardings)
    for _ in range(2):
        old = state
        state, sums = par.train_step(state, batch, jax.random.key(1))
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))  # donated
        assert _same(jax.tree.map(lambda x: x.sharding, state), par.shardings)
    assert np.isfinite(jax.device_get(sums['loss']))
    # A state in another layout is refused, not stepped into whatever layout XLA picks.
    replicated = jax.device_put(jax.device_get(state), NamedSharding(par.mesh, P()))
    with pytest.raises(ValueError, match='sharding'):
        par.train_step(replicated, batch, jax.random.key(1))


# Counted on jax 0.10.2's CPU compiler. The data-parallel step reduces its gradients and
# metric sums in two all-reduces; FSDP gathers every parameter (31 all-gathers, the fused
# query/key/value kernel one of them); model 2 has the all-reduces of tensor parallelism and
# nothing that moves a kernel (the fused projection concatenated on the head axis added 12
# collective-permutes and 22 all-to-alls of kernel and output shards). Its vocabulary (32
# pieces) is split too: the embedding lookups' [rows, T, D] sums and the softmax's [rows, T]
# max and sum are all-reduced (11 all-reduces -> 16), and each half's best token and its
# logit ([rows, T, 2], the accuracy's argmax) gathered; the table itself never moves.
WANT = {
    'data': {'all-reduce': 2},
    'fsdp': {'all-reduce': 3, 'all-gather': 31, 'all-to-all': 4},
    'model 2': {'all-reduce': 16, 'all-gather': 2},
}


@pytest.mark.slow
@pytest.mark.parametrize('layout', sorted(LAYOUTS))
def test_the_collectives_of_each_layout_are_counted(layout):
    counts = collective_counts(_compiled(layout)[3].as_text())
    assert counts == {kind: WANT[layout].get(kind, 0) for kind in COLLECTIVES}


def test_the_rules_place_activations_rows_on_data_before_their_width():
    """'batch' takes the 'data' axis before FSDP's 'embed' does; parameters keep theirs."""
    from flax import linen as nn

    rules = parallel.rules(fsdp=True)
    spec = nn.logical_to_mesh_axes(('batch', 'length', 'embed'), rules)
    assert tuple(spec) == ('data', None, None)
    assert tuple(nn.logical_to_mesh_axes(('embed', 'heads', 'kv'), rules)) == (
        'data',
        'model',
        None,
    )


@pytest.mark.slow
def test_activations_are_constrained_on_a_mesh_only():
    """The sharding mode's step on a mesh holds the activations' constraints; on one device
    and in pmap mode the same model lowers without any."""
    par, state, batch, _ = _compiled('model 2')
    key = jax.random.key(1)
    assert par.lower_step(state, batch, key).as_text().count('sharding_constraint') > 10
    for devices, mode in ((jax.devices('cpu')[:1], 'sharding'), (jax.devices('cpu')[:2], 'pmap')):
        other, model, tx = tiny_parallel(devices, mode)
        params = fill_random(abstract_params(model))
        state = steps.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params))
        state = other.put_state(jax.device_put(state, other.shardings))
        rows = other.put_batch(packed_batch(0))
        assert 'sharding_constraint' not in other.lower_step(state, rows, key).as_text(), mode


@pytest.mark.slow
def test_the_eval_step_reads_the_state_layout_and_pads_rows_that_do_not_split():
    """5 rows over 4 data devices, placed as validation places them (filler rows weigh
    nothing), parameters as the train state holds them: the summed metrics equal one
    device's."""
    par, state, _, _ = _compiled('model 2')
    rows = {k: v[:5, :] for k, v in packed_batch(1).items() if k in ('inputs', 'targets')}
    layout = training_layout(par)
    placed = decoding.place_rows(rows, layout)
    got = jax.device_get(par.eval_step(layout.place(par.global_state(state).params), placed))
    params = jax.device_get(state.params)
    model = tiny_parallel(jax.devices('cpu')[:1])[1]
    # Compiled: one program costs less than the model's ops compiled one by one.
    want = jax.jit(functools.partial(steps.eval_step, model=model, label_smoothing=0.1))(
        params, rows
    )
    for key in steps.SUM_KEYS:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
