"""benchmarks/modern_parts.py on two runs of a few steps (long tier: two train.py and two
evaluate processes; the suite runs the modern variant through every command in
tests/test_modern_run.py): what its report holds; its figures are not results."""

import json

import pytest

from benchmarks import modern_parts
from tests.tiny_run import SMALL


@pytest.mark.long
def test_two_runs_one_after_the_other_are_reported(tmp_path):
    out = tmp_path / 'report.json'
    settings = [f'{k}={v}' for k, v in SMALL.items()]
    settings += ['train.num_steps=3', 'train.log_every=1', 'eval.bleu_every=0']
    settings += ['train.checkpoint_every=3', 'eval.beam_size=2']
    modern_parts.main(
        ['--run=paper=configs/tiny.py', '--run=modern=configs/tiny.py:modern', f'--out={out}']
        + [f'--set={s}' for s in settings]
    )
    report = json.loads(out.read_text())
    paper, modern = report['runs']['paper'], report['runs']['modern']
    assert paper['steps'] == modern['steps'] == 3
    assert modern['model']['positions'] == 'rope' and paper['model']['positions'] == 'sinusoidal'
    assert modern['model']['ffn'] == 'swiglu' and modern['model']['d_ff'] == 64  # SMALL's
    for run in (paper, modern):
        assert run['validation_loss'] > 0 and run['sacrebleu'] >= 0
        assert run['median_s_per_step'] > 0 and run['parameters'] > 0
    # Three FFN matrices at d_ff 64 against two, fewer key/value heads: counted, not equal.
    assert modern['parameters'] != paper['parameters']
