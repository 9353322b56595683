"""benchmarks/large_vocab_checkpoint.py at its tiny size: the state it saves comes back with
the same values, its model is converted NLLB-200's, and its bound is the memory check's; its
figures are not results (at this size the runtime's own memory is most of a phase's peak)."""

import json

import pytest

from benchmarks import large_vocab_checkpoint as bench
from tests.fairseq_models import NLLB_600M_CONFIG
from transformer.interop import fairseq_config


def test_the_model_is_the_one_converting_nllb_gives():
    assert fairseq_config.model_settings(NLLB_600M_CONFIG, 'config.json') == bench.NLLB
    assert bench.SIZES['600m'][1] == NLLB_600M_CONFIG['vocab_size']
    bound = bench._bound('600m')
    assert bound['params'] == 615_073_792  # counted by hand: tests/training/test_footprint.py
    assert bound['bound_gib'] * 2**30 == 16 * bound['params']


@pytest.mark.slow
def test_the_tiny_state_saves_and_restores_with_its_values(tmp_path):
    out = tmp_path / 'report.json'
    report = bench.main(['--size=tiny', f'--work={tmp_path / "work"}', f'--out={out}'])
    assert json.loads(out.read_text())['same_values'] is report['same_values'] is True
    assert report['restore']['step'] == 0
    assert report['bound_gib'] * 2**30 == 16 * report['params']
    # The moments are random, not zeros: the checkpoint holds about the state's bytes.
    assert 0.8 * report['state_gib'] < report['checkpoint_gib'] < 1.2 * report['state_gib']
    # Each phase's figures are there; at this size their differences are the runtime's noise.
    for phase in ('save', 'restore'):
        assert report[phase]['peak_rss_gib'] > 0 and report[phase]['wall_s'] > 0
        assert report[phase]['state_rss_gib'] == pytest.approx(
            report[phase]['peak_rss_gib'] - report['baseline_rss_gib']
        )
    assert report['save']['build_peak_rss_gib'] <= report['save']['peak_rss_gib']
