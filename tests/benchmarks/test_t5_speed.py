"""benchmarks/t5_speed.py: its spiece.model read by transformers' `T5Tokenizer` and by ours
with the same ids (the tag first), its random T5 directory (sharded, a head of its own, the
tensor shapes the projection counts), the projection's arithmetic, and the whole script at the
tiniest sizes on the CPU (a random model converted at two depths, decoded by ours, Hugging
Face and CTranslate2, each in a process of its own; the figures are not results). Needs the
export extra (torch, transformers, ctranslate2), as tests/test_export.py."""

import json
import math

import pytest

from benchmarks import convert_memory, t5_speed
from tests.marian_dir import synthetic_lines

_SKIP = "{} is not installed: pip install -e '.[export]'"
for _module in ('torch', 'transformers', 'ctranslate2', 'sentencepiece'):
    pytest.importorskip(_module, reason=_SKIP.format(_module))

DECODES = ['decode_ours', 'decode_hf', 'decode_ct2']
MEASUREMENTS = ['build_hf_dir', 'build_hf_dir_small', 'convert_small', 'convert_ours']
MEASUREMENTS += ['decode_ours', 'export_ct2', *DECODES[1:]]
TINY = ['--d_model=16', '--heads=2', '--d_kv=6', '--d_ff=24', '--vocab=400', '--spm_pieces=60']


def _data(path, count=120, test=10):
    path.mkdir()
    pairs = synthetic_lines(count)
    for lang, side in (('en', 0), ('de', 1)):
        (path / f'train.{lang}').write_text('\n'.join(p[side] for p in pairs) + '\n')
        (path / f'test2016.{lang}').write_text('\n'.join(p[side] for p in pairs[:test]) + '\n')
    return pairs


def test_the_spiece_model_gives_t5_ids_with_the_tag_first(tmp_path):
    """V - 100 pieces and T5's 100 sentinels, as T5Tokenizer and our vocabulary read them;
    '<2de> ' + text is the tag's id, the text's and eos, as --source_tag '<2de>' gives; text
    never encodes to a filler. Too small a --vocab is one line."""
    import transformers

    from transformer.interop.t5_vocab import T5Vocabulary

    texts = [t for pair in synthetic_lines(60) for t in pair]
    (tmp_path / t5_speed.SPM_FILE).write_bytes(t5_speed.spiece_model(texts, 60, 400))
    theirs = transformers.T5Tokenizer.from_pretrained(tmp_path)
    ours = T5Vocabulary(str(tmp_path))
    assert len(theirs) == ours.size + ours.extra_ids == 400 and ours.size == 300
    tag = theirs.convert_tokens_to_ids(t5_speed.TAG)
    assert tag == ours.token_id(t5_speed.TAG) and 2 < tag < 60
    filler = theirs.convert_tokens_to_ids('▁fill000001')
    assert 60 <= filler < theirs.convert_tokens_to_ids('▁fill000002') < 300
    for line in texts[:20]:
        ids = theirs(f'{t5_speed.TAG} {line}')['input_ids']
        assert ids == [tag, *ours.encode(line), 1]
        assert max(ids) < filler
    with pytest.raises(SystemExit, match='--vocab must be at least') as info:
        t5_speed.spiece_model(texts, 60, 120)
    assert '\n' not in str(info.value)


def test_the_random_directory_is_sharded_untied_and_of_the_counted_size(tmp_path):
    """Every tensor `convert_memory.tensor_shapes` counts is the model's (the projection's
    float32 sizes are the model's), in several shards, lm_head apart from the embedding, and
    config.json says tie_word_embeddings false as the hub's does."""
    from safetensors import safe_open

    args = t5_speed._parse_args([*TINY, '--layers=2', '--small_layers=1'])
    shape = t5_speed.shape_of(args, 2)
    summary = t5_speed._build_hf(tmp_path, shape, '20KB')
    assert summary['shards'] > 1
    index = json.loads((tmp_path / 'model.safetensors.index.json').read_text())
    shapes = convert_memory.tensor_shapes(**shape)
    assert set(index['weight_map']) == set(shapes)
    assert summary['parameters'] == sum(math.prod(s) for s in shapes.values())
    tensors = {}
    for name, file in index['weight_map'].items():
        with safe_open(str(tmp_path / file), 'np') as f:
            tensors[name] = f.get_tensor(name)
            assert tensors[name].shape == shapes[name]
    assert not (tensors['lm_head.weight'] == tensors['shared.weight']).all()
    config = json.loads((tmp_path / 'config.json').read_text())
    assert config['tie_word_embeddings'] is False and 'scale_decoder_outputs' not in config


def test_the_projection_is_linear_in_the_layers():
    args = t5_speed._parse_args(['--layers=4', '--small_layers=2', '--project_layers=32'])
    small = {'peak_rss_mib': 1000.0, 'command_s': 10.0}
    full = {'peak_rss_mib': 1400.0, 'command_s': 13.0}
    out = t5_speed.projection(args, small, full)
    assert out['peak_rss_mib'] == {'fixed': 600.0, 'per_layer': 200.0, 'projected': 7000.0}
    assert out['command_s'] == {'fixed': 7.0, 'per_layer': 1.5, 'projected': 55.0}
    sizes = out['model_float32_mib']
    d, inner, ff = 1024, 16 * 128, 8192
    layer_pair = (4 + 8) * d * inner + 2 * 3 * d * ff + 5 * d  # encoder + decoder layer
    assert sizes['32'] - sizes['4'] == pytest.approx(28 * 4 * layer_pair / 2**20)
    assert sizes['4'] - 2 * (sizes['4'] - sizes['2']) == pytest.approx(
        4 * (2 * 256000 * d + 2 * (32 * 16 + d)) / 2**20
    )  # the embedding, the head, each stack's bucket table and final norm
    assert out['projected_peak_over_model'] == 7000.0 / sizes['32']


@pytest.mark.parametrize('layers', [('--layers=2', '--small_layers=2'), ('--small_layers=0',)])
def test_two_sizes_to_measure_convert_at_or_one_line(layers):
    with pytest.raises(SystemExit, match='--small_layers .* must be at least 1 and fewer') as e:
        t5_speed._parse_args(list(layers))
    assert '\n' not in str(e.value)


@pytest.mark.long  # 32-48 s: eight processes, one compiling a beam search
def test_t5_speed_times_counts_and_projects(tmp_path, capsys):
    _data(tmp_path / 'data')
    out = tmp_path / 't5_speed.json'
    t5_speed.main(
        [f'--data={tmp_path}/data', f'--work={tmp_path}/work', *TINY, '--layers=2']
        + ['--small_layers=1', '--shard_size=20KB', '--sentences=3', '--batch_size=2']
        + ['--beam_size=2', '--threads=1', f'--out={out}']
    )
    report = json.loads(out.read_text())
    results = {r['measurement']: r for r in report['results']}
    assert list(results) == MEASUREMENTS
    assert results['build_hf_dir']['shards'] > 1
    assert {'cpu', 'date', 'jax', 'torch', 'transformers', 'ctranslate2'} <= report.keys()
    for name in MEASUREMENTS:
        assert results[name]['command_s'] > 0 and results[name]['peak_rss_mib'] > 0
    for name in DECODES:
        result = results[name]
        assert result['hypotheses'] == 3
        assert 0 < result['text_pieces'] <= result['output_tokens'] <= result['limit_tokens']
        assert result['tokens_per_s'] > result['tokens_per_command_s'] > 0
    projected = report['projection']
    assert projected['layers'] == {'small': 1, 'measured': 2, 'projected': 32}
    parameters = results['build_hf_dir']['parameters']
    assert projected['model_float32_mib']['2'] == pytest.approx(4 * parameters / 2**20)
    peak = projected['peak_rss_mib']
    assert peak['fixed'] + 2 * peak['per_layer'] == pytest.approx(
        results['convert_ours']['peak_rss_mib']
    )
    printed = capsys.readouterr().out.splitlines()
    assert [json.loads(line).get('measurement') for line in printed[:-1]] == [
        *MEASUREMENTS[:4],
        None,
        *MEASUREMENTS[4:],
    ]
    assert printed[-1] == f'saved {out}'
