"""The suite's choice of XLA's CPU code generators (tests/conftest.py): a program of one CPU
device is compiled by the older ones, a program of several devices, or one whose
``compiler_options`` name the flag, by the default ones.

The two kinds are told apart by the compiled program: the older generators write a scatter
as a ``while`` loop (XLA's scatter expander), the default ones keep the scatter op.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.compiles import DEFAULT_GENERATORS


def _add_at(x, rows):
    return x.at[rows].add(1.0)


def _compiled_text(x, **jit_kwargs) -> str:
    return jax.jit(_add_at, **jit_kwargs).lower(x, jnp.array([1, 3])).compile().as_text()


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='the choice is made for CPU programs')
def test_one_device_programs_take_the_older_generators_and_the_rest_the_default():
    x = jnp.zeros((8, 16))
    assert 'while(' in _compiled_text(x)
    assert 'while(' not in _compiled_text(x, compiler_options=DEFAULT_GENERATORS)
    mesh = jax.make_mesh(
        (8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices('cpu')
    )
    sharded = jax.device_put(x, NamedSharding(mesh, P('data')))
    assert 'while(' not in _compiled_text(sharded)
