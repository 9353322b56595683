"""Run directories written before the package was split into layers still load, translate
and evaluate the same: ``tests/fixtures/run_before_layers`` was trained (2 steps of a 16-wide
model on the synthetic task) by the code of that time, which also wrote ``expected.json``:
its parameters' absolute sums, greedy translations and beam-3 n-best lists of six sentences.
The optimizer state is left out (the commands read parameters only). Its config.json is given
train.loss_pass='float32', as 2698791-9f56641 wrote it (a key since removed: docs/experiments.md,
"Removed options")."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from transformer import evaluate
from transformer.checkpoint import load_model
from transformer.decoding import DecodeOptions, translation

FIXTURE = pathlib.Path(__file__).parents[1] / 'fixtures' / 'run_before_layers'


@pytest.mark.slow
def test_a_run_written_before_the_layers_translates_as_it_did(tmp_path):
    run = tmp_path / 'run'
    shutil.copytree(FIXTURE, run)
    saved = json.loads((run / 'config.json').read_text())
    saved['train']['loss_pass'] = 'float32'
    (run / 'config.json').write_text(json.dumps(saved))
    expected = json.loads((run / 'expected.json').read_text())
    config, tokenizer, model, params, steps = load_model(str(run))
    assert steps == expected['steps']
    sums = {
        jax.tree_util.keystr(k): float(np.abs(np.asarray(v, np.float64)).sum())
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    assert sums == expected['param_abs_sums']
    # One batch of the six: each search and length limit compiles one program.
    kwargs = dict(
        options=DecodeOptions(10), batch_size=len(expected['sources']), max_input_tokens=32
    )
    lines = expected['sources']
    greedy = translation.translate_lines(lines, tokenizer, model, params, beam_size=1, **kwargs)
    assert greedy == expected['greedy']
    nbest = translation.translate_lines(
        lines, tokenizer, model, params, beam_size=3, nbest=3, **kwargs
    )
    assert translation.format_nbest(nbest) == expected['nbest3']
    scores = evaluate.run(str(run), max_examples=6, beam_size=1, output=str(tmp_path / 'h.txt'))
    # evaluate decodes with the config's length limit
    kwargs['options'] = DecodeOptions(config.eval.extra_length)
    assert (tmp_path / 'h.txt').read_text().splitlines() == translation.translate_lines(
        lines, tokenizer, model, params, beam_size=1, **kwargs
    )
    assert scores['steps'] == [2] and 0 <= scores['sacrebleu'] <= 100
