"""Decoding on a mesh (transformer/decoding/mesh.py): a batch's rows split over the data axis,
parameters in each training layout, against one device.

A tiny model with random, peaked parameters (tests/random_params.py) and 13 sources of
lengths 2-9: 13 rows pad to 16 on 4 data devices and to 14 on 2, so the filler rows are
exercised and dropped. Greedy and beam search on one device, on 4 devices (data only), with
FSDP over 4 and with a model axis of 2 must give the same tokens: every row is computed by
the same operations on every layout, and only the order of a sharded reduction (FSDP's
d_model, the model axis' heads) can change a float's last bit. With these peaked logits no
near tie turns, so the tokens are asserted identical in every layout.
"""

import functools

import jax
import numpy as np
import pytest

from tests.random_params import fill_random
from tests.tiny_run import tiny_model
from transformer import decoding
from transformer.model import abstract_params
from transformer.training import ParallelSettings, decode_layout

MODEL = tiny_model(share_embeddings='none')
ROWS = 13
# 4 devices split the rows, shard d_model and the heads as 8 would (every axis still over
# several devices, filler rows on each mesh), and their programs compile and run in less time.
DEVICES = 4


@functools.cache
def _params():
    return fill_random(abstract_params(MODEL), seed=3, logits_scale=6.0)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    inputs = np.zeros((ROWS, 10), np.int32)
    for row, length in enumerate(rng.integers(2, 10, size=ROWS)):
        inputs[row, : length - 1] = rng.integers(3, 32, size=length - 1)
        inputs[row, length - 1] = 1  # EOS
    return inputs


LAYOUTS = {
    'data': ParallelSettings(),
    'fsdp': ParallelSettings(fsdp=True),
    'model2': ParallelSettings(model_parallelism=2),
    'pmap': ParallelSettings(parallelism='pmap'),
}


@functools.cache
def _layout(name: str, gather_params: bool = False):
    return decode_layout(
        MODEL, LAYOUTS[name], gather_params=gather_params, devices=jax.devices('cpu')[:DEVICES]
    )


@functools.cache
def _one_device(beam_size: int):
    search = dict(beam_size=beam_size, options=decoding.DecodeOptions(extra_length=5))
    return decoding.decode(decoding.translate_batch, MODEL, _params(), _inputs(), **search)


@pytest.mark.slow
@pytest.mark.parametrize(
    ('name', 'beam_size'),
    [
        ('data', 1),
        ('fsdp', 3),
        # Long tier: the scanned model's model-axis case decodes on this mesh, and
        # tests/evaluation/test_evaluate_mesh.py's greedy evaluate with a model axis of 2
        # gives one device's tokens.
        pytest.param('model2', 1, marks=pytest.mark.long),
    ],
)
def test_mesh_decodes_the_tokens_of_one_device(name, beam_size):
    """Greedy on data-only and model-axis meshes, beam search with FSDP (and with data only
    in `test_nbest_on_a_mesh_equals_one_device`): the tokens of one device."""
    layout = _layout(name)
    params = layout.place(_params())
    search = dict(beam_size=beam_size, options=decoding.DecodeOptions(extra_length=5))
    tokens = decoding.decode(decoding.translate_batch, MODEL, params, _inputs(), layout, **search)
    one = _one_device(beam_size)
    assert tokens.shape == one.shape == (ROWS, 15)
    assert len({tuple(row) for row in one}) > ROWS // 2  # the rows differ: a real check
    np.testing.assert_array_equal(tokens, one)


def test_parameters_stay_in_the_training_layout():
    """FSDP shards d_model over 'data', a model axis shards heads, data-only and pmap runs
    replicate; ``gather_params`` replicates FSDP's: asserted on the arrays."""
    kernel = ('encoder_layer_0', 'self_attention', 'query', 'kernel')  # [D, N, H]

    def leaf(layout):
        found = layout.place(_params())
        for key in kernel:
            found = found[key]
        assert len(found.sharding.device_set) == DEVICES
        return found

    def spec(layout):
        return leaf(layout).sharding.spec

    assert spec(_layout('fsdp'))[0] == 'data'  # D over the 4 data devices
    model2 = _layout('model2')
    assert model2.mesh.shape['model'] == 2 and spec(model2)[:2] == (None, 'model')  # N
    # A pmap run: data only.
    assert dict(_layout('pmap').mesh.shape) == {'data': DEVICES, 'model': 1}
    for replicated in (_layout('data'), _layout('pmap'), _layout('fsdp', gather_params=True)):
        assert leaf(replicated).sharding.is_fully_replicated
    assert not leaf(_layout('fsdp')).sharding.is_fully_replicated


@pytest.mark.slow
def test_nbest_on_a_mesh_equals_one_device():
    """Beam search's sequences and scores, gathered from 4 devices, equal one device's."""
    search = dict(beam_size=3, options=decoding.DecodeOptions(extra_length=5))
    layout = _layout('data')
    one = decoding.decode(decoding.beam_search, MODEL, _params(), _inputs(), **search)
    mesh = decoding.decode(
        decoding.beam_search, MODEL, layout.place(_params()), _inputs(), layout, **search
    )
    np.testing.assert_array_equal(mesh[0], one[0])
    np.testing.assert_allclose(mesh[1], one[1], rtol=1e-6)


def test_rows_are_split_into_blocks_per_process():
    """Padded to a multiple of the data axis; each process's block; filler rows not counted;
    processes sharing a block (a model axis across them) both count it."""
    layout = _layout('data')
    assert layout.padded_rows(13) == 16
    two = decoding.DecodeLayout(layout.mesh, layout.param_shardings, {0: (0, 2), 1: (1, 2)})
    assert (two.rows_of(0, 13), two.rows_of(1, 13)) == (range(0, 8), range(8, 16))
    index = np.r_[np.arange(11), -1, -1, -1, -1, -1]  # 11 sentences, 5 filler rows
    batches = [{'index': index}, {'index': np.arange(16)}]
    assert decoding.sentences_per_process(batches, two) == [8 + 8, 3 + 8]
    shared = decoding.DecodeLayout(layout.mesh, layout.param_shardings, {0: (0, 1), 1: (0, 1)})
    assert decoding.sentences_per_process(batches, shared) == [27, 27]


def test_filler_rows_never_fully_masked():
    padded = decoding.place_rows({'inputs': _inputs(), 'targets': _inputs()}, _layout('data'))
    inputs, targets = (np.asarray(padded[k]) for k in ('inputs', 'targets'))
    assert inputs.shape == (16, 10)
    np.testing.assert_array_equal(inputs[ROWS:, 0], 1)  # [EOS], as the evaluation filler
    assert not targets[ROWS:].any()  # weighs nothing in a loss


@pytest.mark.slow
def test_an_ensemble_on_a_mesh_equals_one_device():
    """Both members placed in the layout (`DecodeLayout.place`), greedy: one device's tokens."""
    members = decoding.ensemble_params([_params(), fill_random(abstract_params(MODEL), seed=4)])
    search = dict(beam_size=1, options=decoding.DecodeOptions(extra_length=5))
    one = decoding.decode(decoding.translate_batch, MODEL, members, _inputs(), **search)
    layout = _layout('data')
    placed = layout.place(members)
    assert all(_kernel_of(m).sharding.mesh == layout.mesh for m in placed.members)
    mesh = decoding.decode(decoding.translate_batch, MODEL, placed, _inputs(), layout, **search)
    np.testing.assert_array_equal(mesh, one)


def _kernel_of(params):
    return params['encoder_layer_0']['self_attention']['query']['kernel']


@pytest.mark.slow
@pytest.mark.parametrize(
    ('name', 'beam_size'),
    [
        # Long tier: the model-axis case runs the scanned beam search with its rows split over
        # a data axis, and `test_nbest_on_a_mesh_equals_one_device` the data-only layout's.
        pytest.param('data', 3, marks=pytest.mark.long),
        ('fsdp', 1),
        ('model2', 3),
    ],
)
def test_a_scanned_model_on_a_mesh_decodes_the_tokens_of_one_device(name, beam_size):
    """model.scan_layers: the stacked parameters and caches (their layer axis first) on each
    mesh, rows still split over the data axis as the search shrinks its batch."""
    import dataclasses

    from transformer.model import Transformer, stack_layers

    model = Transformer(dataclasses.replace(MODEL.config, scan_layers=True))
    layout = decode_layout(model, LAYOUTS[name], devices=jax.devices('cpu')[:DEVICES])
    params = layout.place(stack_layers(_params()))
    search = dict(beam_size=beam_size, options=decoding.DecodeOptions(extra_length=5))
    tokens = decoding.decode(decoding.translate_batch, model, params, _inputs(), layout, **search)
    np.testing.assert_array_equal(tokens, _one_device(beam_size))
