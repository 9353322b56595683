"""benchmarks/convert_memory.py at a tiny size: the directory it writes is a T5 v1.1 the
t5 family reads tensor by tensor, equal to reading every shard whole, and the measured
conversion reports its figures (not results at this size)."""

import numpy as np
import pytest

from benchmarks import convert_memory
from transformer.interop import state_dict

pytest.importorskip('safetensors')
pytest.importorskip('sentencepiece')

SHAPE = dict(d=16, heads=2, d_kv=6, d_ff=24, layers=2, vocab=256)


def test_the_written_directory_reads_lazily_as_it_reads_whole(tmp_path):
    from transformer.interop import t5

    directory = tmp_path / 'hf'
    model_bytes = convert_memory.write_model(directory, SHAPE, shards=3)
    lazy = state_dict.open_state_dict(str(directory), 'T5')
    whole = state_dict.read_state_dict(str(directory), 'T5')
    assert isinstance(lazy, state_dict.LazyTensors) and sorted(lazy) == sorted(whole)
    assert sum(4 * v.size for v in whole.values()) == model_bytes
    for name in whole:
        np.testing.assert_array_equal(lazy[name], whole[name])
    params = t5.load(str(directory)).params
    head = whole['lm_head.weight'].T
    np.testing.assert_array_equal(params['logits_dense']['kernel'], head)
    assert params['logits_dense']['kernel'].flags['C_CONTIGUOUS']
    assert params['encoder_layer_1']['self_attention']['query']['kernel'].shape == (16, 2, 6)


def test_a_shard_lacking_a_tensor_its_index_names_is_one_line(tmp_path):
    import json

    directory = tmp_path / 'hf'
    convert_memory.write_model(directory, SHAPE, shards=2)
    index = json.loads((directory / 'model.safetensors.index.json').read_text())
    index['weight_map']['extra.weight'] = 'model-00001-of-00002.safetensors'
    (directory / 'model.safetensors.index.json').write_text(json.dumps(index))
    with pytest.raises(state_dict.PretrainedError, match='lacks extra.weight, which') as e:
        state_dict.open_state_dict(str(directory), 'T5')
    assert '\n' not in str(e.value)


@pytest.mark.slow
def test_the_conversion_is_measured_in_its_own_process(tmp_path):
    result = convert_memory.run(tmp_path / 'work', SHAPE, shards=2)
    assert (tmp_path / 'work' / 'run' / 'checkpoints').is_dir()
    # at this size the two peaks are the imports' alone, either may be the larger
    assert result['convert_peak_rss_mib'] > 100 and result['import_only_peak_rss_mib'] > 100
    less_import = result['convert_peak_rss_mib'] - result['import_only_peak_rss_mib']
    assert result['peak_less_import_over_model'] == pytest.approx(
        less_import / result['model_float32_mib']
    )
    assert result['peak_over_model'] == pytest.approx(
        result['convert_peak_rss_mib'] / result['model_float32_mib']
    )
