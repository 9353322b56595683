"""benchmarks/validation_devices.py runs end to end on the CPU's 8 host devices (its times are
not results: the devices share two cores)."""

import json

import pytest

from benchmarks import validation_devices


@pytest.mark.slow
def test_validation_bleu_on_one_device_and_on_all_gives_one_score_and_a_ratio(run_dir, tmp_path):
    import jax

    out = tmp_path / 'validation_devices.json'
    validation_devices.main([f'--workdir={run_dir}', '--repeats=1', f'--out={out}'])
    report = json.loads(out.read_text())
    devices = len(jax.devices())
    assert report['devices'] == devices and report['sentences'] > 0
    assert list(report['seconds']) == ['one device', f'{devices} devices']
    assert all(len(times) == 1 and times[0] > 0 for times in report['seconds'].values())
    # The same hypotheses on one device and on all: the same score.
    assert len(set(report['sacrebleu'].values())) == 1
    one, many = (times[0] for times in report['seconds'].values())
    assert report['ratio_of_medians'] == pytest.approx(many / one)
    assert report['ratio_spread'] == [pytest.approx(many / one)] * 2
