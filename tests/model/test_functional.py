"""transformer/model/functional.py's traces kept per configuration: the parameters' shapes and
partition specs are traced once per model configuration in a process, and each call still
gets a tree of its own."""

import dataclasses

import jax

from tests.tiny_run import tiny_model
from transformer.model import functional


def test_shapes_and_partition_specs_are_traced_once_per_configuration(monkeypatch):
    traced = []
    real = functional.init_params
    monkeypatch.setattr(
        functional, 'init_params', lambda *args, **kwargs: traced.append(1) or real(*args, **kwargs)
    )
    model = tiny_model(vocab_size=37)  # asked for by no other test: its first call traces
    first = functional.abstract_params(model)
    second = functional.abstract_params(type(model)(model.config))
    assert len(traced) == 1
    assert first is not second and jax.tree.structure(first) == jax.tree.structure(second)
    assert first['shared_embedding']['embedding'].shape == (37, model.config.d_model)
    first.clear()  # a caller's changes stay its own
    assert functional.abstract_params(model)['shared_embedding']['embedding'].shape[0] == 37
    other = dataclasses.replace(model.config, vocab_size=41)
    assert (
        functional.abstract_params(type(model)(other))['shared_embedding']['embedding'].shape[0]
        == 41
    )
    assert len(traced) == 2

    specs = functional.logical_partition_specs(model)
    again = functional.logical_partition_specs(model)
    assert specs is not again and specs == again
    assert specs['shared_embedding']['embedding'] == jax.sharding.PartitionSpec('vocab', 'embed')
