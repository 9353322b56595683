"""What a checkpoint save costs on a CPU: a state replicated over 8 devices is copied to the
host whole, from one device, with no program compiled for it."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax import monitoring
from jax.sharding import NamedSharding, PartitionSpec

from tests.tiny_run import tiny_run_config
from transformer.checkpoint import arrays
from transformer.checkpoint.directory import checkpoint_manager

# Shapes no other test saves (each with an axis that 8 devices divide, as replica-parallel
# saving needs), so that no program compiled for them earlier in this process
# hides a compilation here.
SHAPES = [(56, 13), (104,), (5, 40, 3), (72, 6)]


def test_a_replicated_state_saves_without_compiling_and_restores_equal(tmp_path):
    """Orbax's replica-parallel saving (its default off a GPU) would cut each array into one
    slice per device, one compiled `lax.slice` per shape: on a CPU none is compiled."""
    if jax.default_backend() != 'cpu':
        pytest.skip('off a CPU the save keeps Orbax choice of how replicas are copied')
    devices = np.array(jax.devices('cpu')[:8])
    replicated = NamedSharding(jax.sharding.Mesh(devices, ('data',)), PartitionSpec())
    rng = np.random.default_rng(0)
    state = {
        f'w{i}': jax.device_put(rng.normal(size=s).astype(np.float32), replicated)
        for i, s in enumerate(SHAPES)
    }
    compiled = []

    def count(event, duration, **kwargs):
        if event == '/jax/core/compile/backend_compile_duration':
            compiled.append(duration)

    manager = checkpoint_manager(str(tmp_path), tiny_run_config(2))
    monitoring.register_event_duration_secs_listener(count)
    try:
        manager.save(1, args=ocp.args.Composite(params=arrays.save_args(state)))
        manager.wait_until_finished()
    finally:
        monitoring.unregister_event_duration_listener(count)
    assert compiled == []
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored = arrays.restore(manager, 1, {'params': abstract})['params']
    for name, value in state.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(value))
