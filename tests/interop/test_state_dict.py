"""A directory's weights files (transformer/interop/state_dict.py): sharded safetensors read
through their index as one state dict; a missing shard, a shard without a tensor its index
puts there, or no weights at all stop in one line."""

import json

import numpy as np
import pytest

from transformer.interop.fairseq_params import FairseqError
from transformer.interop.state_dict import read_state_dict

safetensors_numpy = pytest.importorskip(
    'safetensors.numpy', reason="safetensors is not installed: pip install -e '.[export]'"
)
TENSORS = {'a.weight': np.arange(6, dtype=np.float32).reshape(2, 3), 'b.bias': np.ones(3)}


def _sharded(directory, weight_map=None):
    """Two shards and their index: a.weight in the first, b.bias in the second."""
    safetensors_numpy.save_file(
        {'a.weight': TENSORS['a.weight']}, str(directory / 's1.safetensors')
    )
    safetensors_numpy.save_file(
        {'b.bias': TENSORS['b.bias'].astype(np.float16)}, str(directory / 's2.safetensors')
    )
    weight_map = weight_map or {'a.weight': 's1.safetensors', 'b.bias': 's2.safetensors'}
    index = {'metadata': {}, 'weight_map': weight_map}
    (directory / 'model.safetensors.index.json').write_text(json.dumps(index))


def test_shards_read_as_one_float32_state_dict(tmp_path):
    _sharded(tmp_path)
    state = read_state_dict(str(tmp_path), 'M2M100', FairseqError)
    assert state.keys() == TENSORS.keys()
    for name, value in TENSORS.items():
        assert state[name].dtype == np.float32
        np.testing.assert_array_equal(state[name], value)


@pytest.mark.parametrize(
    'weight_map, says',
    [
        ({'a.weight': 's1.safetensors', 'b.bias': 's3.safetensors'}, 'lists s3.safetensors, which'),
        ({'a.weight': 's2.safetensors', 'b.bias': 's2.safetensors'}, 'lacks a.weight, which'),
        ({'a.weight': '../s1.safetensors'}, "names '../s1.safetensors' for a.weight, not a file"),
    ],
)
def test_a_shard_index_that_does_not_match_its_shards_stops_in_one_line(tmp_path, weight_map, says):
    _sharded(tmp_path, weight_map)
    with pytest.raises(FairseqError) as info:
        read_state_dict(str(tmp_path), 'M2M100', FairseqError)
    assert says in str(info.value) and '\n' not in str(info.value)


def test_a_directory_without_weights_names_the_files_looked_for(tmp_path):
    with pytest.raises(FairseqError) as info:
        read_state_dict(str(tmp_path), 'mBART', FairseqError)
    assert str(info.value) == (
        f'{tmp_path} holds none of model.safetensors, pytorch_model.bin, '
        'model.safetensors.index.json, pytorch_model.bin.index.json: the mBART weights are '
        'missing.'
    )
