"""The vocabulary axis on the 'model' mesh axis (transformer/training/parallel.py `rules`,
`splits_vocab`): the [V, D] embedding, a [D, V] output projection, the [V] logits bias and
Adam's moments of them are split over the axis where it divides V, and stay whole on every
device where it does not (jit's shardings need equal shards; padding V would change the
parameters' shapes). Training on such a layout equals one device:
tests/training/test_parallel.py `test_layouts_equal_one_device_and_hold_their_share`."""

import logging

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.random_params import fill_random
from tests.tiny_run import tiny_model, tiny_parallel
from transformer.model import abstract_params
from transformer.training import parallel
from transformer.training.decode_layout import ParallelSettings, decode_layout


def _shardings(model_parallelism: int, **model):
    par, model, _ = tiny_parallel(
        jax.devices('cpu'), model=tiny_model(**model), model_parallelism=model_parallelism
    )
    return par, model


@pytest.mark.parametrize('model_parallelism', [2, 4])
def test_a_model_axis_that_divides_the_vocabulary_splits_it(model_parallelism):
    par, model = _shardings(model_parallelism, vocab_size=32)
    table = par.shardings.params['shared_embedding']['embedding']
    assert table.spec == P('model', None)
    assert par.shardings.opt_state[-1][0].mu['shared_embedding']['embedding'].spec == table.spec
    placed = jax.device_put(fill_random(abstract_params(model)), par.shardings.params)
    shard = placed['shared_embedding']['embedding'].addressable_shards[0]
    assert shard.data.shape == (32 // model_parallelism, 32)
    # Decoding places the parameters as training does.
    settings = ParallelSettings(model_parallelism=model_parallelism)
    layout = decode_layout(model, settings, devices=jax.devices('cpu'))
    assert layout.param_shardings['shared_embedding']['embedding'].spec == table.spec


def test_an_untied_output_head_splits_on_the_vocabulary_too():
    par, _ = _shardings(2, vocab_size=32, share_embeddings='none', logits_bias=True)
    params = par.shardings.params
    assert params['source_embedding']['embedding'].spec == P('model', None)
    assert params['logits_dense']['kernel'].spec == P(None, 'model')
    assert params['logits_bias'].spec == P('model')


def test_a_vocabulary_the_axis_does_not_divide_stays_whole_with_a_log_line(caplog):
    """34 pieces over a model axis of 4: every device holds the whole table (heads and d_ff
    are split as ever), and a line says why; over 2 the same vocabulary splits (17 a device).
    NLLB-200's 256206 pieces are such a case: even, not a multiple of 4."""
    assert parallel.splits_vocab(256206, 2) and not parallel.splits_vocab(256206, 4)
    assert not parallel.splits_vocab(32, 1)
    with caplog.at_level(logging.INFO, logger='absl'):
        par, model = _shardings(4, vocab_size=34)
    assert par.shardings.params['shared_embedding']['embedding'].spec == P(None, None)
    query = par.shardings.params['encoder_layer_0']['self_attention']['query']['kernel']
    assert query.spec == P(None, 'model', None)
    assert "The vocabulary's 34 pieces stay whole on each device" in caplog.text
    placed = jax.device_put(fill_random(abstract_params(model)), par.shardings.params)
    shards = placed['shared_embedding']['embedding'].addressable_shards
    assert {s.data.shape for s in shards} == {(34, 32)}
    np.testing.assert_array_equal(shards[0].data, shards[-1].data)
    assert _shardings(2, vocab_size=34)[0].shardings.params['shared_embedding'][
        'embedding'
    ].spec == P('model', None)
