"""benchmarks/decode_speed.py and decode_peers.py run end to end at tiny sizes on the CPU (their
figures are not results)."""

import json

import numpy as np
import pytest

from benchmarks import decode_peers, decode_speed

# A one-layer model of d_model 32 over 4 sources of 3 to 8 tokens, 6 decoding steps.
TINY = '--vocab_size 32 --d_model 32 --num_heads 4 --d_ff 64 --num_layers 1 --batch_size 4'
TINY += ' --min_length 3 --max_length 8 --beam_size 2 --max_decode_len 6 --repeats 1'


@pytest.mark.slow
def test_decode_speed_prints_and_saves_both_searches(tmp_path, capsys):
    out = tmp_path / 'decode_speed.json'
    decode_speed.main([*TINY.split(), f'--out={out}'])
    report = json.loads(out.read_text())
    assert report['settings']['beam_size'] == 2 and 'out' not in report['settings']
    assert {'device', 'cpu', 'jax', 'load_average_1min'} <= set(report)
    assert 3 <= report['mean_source_tokens'] <= 8
    assert list(report['results']) == ['greedy', 'beam_2']
    for result in report['results'].values():
        assert set(result) == {
            'sentences_per_s',
            'first_call_s',
            'best_s',
            'median_s',
            'mean_output_tokens',
            'tokens_checksum',
        }
        assert result['sentences_per_s'] == pytest.approx(4 / result['best_s'])
        assert 1 <= result['mean_output_tokens'] <= 6
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(':')[0].strip() for line in printed[:2]] == ['greedy', 'beam_2']
    assert all(' sentences/s (best ' in line for line in printed[:2])
    assert printed[2] == f'saved {out}'


def test_decode_peers_without_flax_wmt_stops_in_one_line_before_decoding(tmp_path, monkeypatch):
    """The peer's code is read from a google/flax checkout, which the suite does not have:
    the script is checked up to that point, and its own half (`ours_search`) below."""
    monkeypatch.delenv('FLAX_WMT_DIR', raising=False)
    out = tmp_path / 'decode_peers.json'
    with pytest.raises(SystemExit) as unset:
        decode_peers.main([*TINY.split(), f'--out={out}'])
    assert 'set FLAX_WMT_DIR' in str(unset.value.code) and '\n' not in str(unset.value.code)
    monkeypatch.setenv('FLAX_WMT_DIR', str(tmp_path))
    with pytest.raises(SystemExit) as empty:
        decode_peers.main([*TINY.split(), f'--out={out}'])
    assert f'FLAX_WMT_DIR={tmp_path} has no models.py or decode.py' in str(empty.value.code)
    assert not out.exists()


@pytest.mark.slow
def test_decode_peers_own_searches_decode_the_given_sources():
    """Our side of the comparison: beam search ([B, K, T]) and greedy ([B, T]) over the same
    sources, each running exactly max_decode_len steps."""
    parser = decode_peers.argparse.ArgumentParser()
    decode_speed.add_size_flags(parser, repeats=1)
    parser.add_argument('--attention_impl', default='einsum')
    args = parser.parse_args(TINY.split())
    inputs = decode_speed.random_sources(args)
    beams = np.asarray(decode_peers.ours_search(args, inputs, 2)())
    greedy = np.asarray(decode_peers.ours_search(args, inputs, 1)())
    assert beams.shape == (4, 2, 6) and greedy.shape == (4, 6)
