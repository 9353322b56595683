"""benchmarks/decode_collectives.py's count, on small compiled loops with a known collective
(compiling the script's base-sized searches takes minutes: they are its run, not its test)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import decode_collectives


def _loop(x):
    def body(carry):
        i, y = carry
        return i + 1, y * 0.5 + jnp.sum(y)  # a sum over every row: across devices if split

    return jax.lax.while_loop(lambda carry: carry[0] < 3, body, (0, x))[1]


def test_the_step_count_finds_the_loops_all_reduce_and_nothing_on_one_device():
    devices = jax.devices('cpu')
    mesh = jax.make_mesh(
        (len(devices),), ('data',), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
    )
    rows = np.ones((2 * len(devices), 4), np.float32)
    split = jax.device_put(rows, NamedSharding(mesh, P('data')))
    counts = decode_collectives.step_collectives(jax.jit(_loop).lower(split).compile().as_text())
    assert counts['all-reduce'] >= 1 and set(counts) == set(decode_collectives.KINDS)
    one = jax.device_put(rows, devices[0])
    alone = decode_collectives.step_collectives(jax.jit(_loop).lower(one).compile().as_text())
    assert sum(alone.values()) == 0
