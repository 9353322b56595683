"""The evaluate command: decode a split, score it, write hypotheses and scores."""

import json

import pytest

from transformer import evaluate


def test_evaluate_command_writes_hypotheses_and_scores(run_dir, tmp_path):
    """`python -m transformer.evaluate` decodes the test split with beam search, prints the
    scores and writes one hypothesis per reference plus a JSON of the scores."""
    out = tmp_path / 'hyps.txt'
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli(
            [
                'evaluate',
                f'--workdir={run_dir}',
                '--beam_size=2',
                '--max_examples=7',
                f'--output={out}',
            ]
        )
    assert not exit_info.value.code
    lines = out.read_text().splitlines()
    assert len(lines) == 7
    scores = json.loads(out.with_suffix('.json').read_text())
    assert scores['num_sentences'] == 7 and scores['beam_size'] == 2 and scores['steps'] == [4]
    assert 0.0 <= scores['sacrebleu'] <= 100.0
