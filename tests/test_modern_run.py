"""A run of configs/tiny.py:modern's parts (rotary positions, RMSNorm, pre-LN, SwiGLU, QK-norm,
grouped keys/values) with the z-loss, through every command: training and a resume (exact
resume itself: tests/training/test_trainer.py), evaluate (beam search), translate (sampling),
score and visualize; and a resume that changes a part is refused. Each search runs once (each
compiles a program of its own for the variant): the commands call the same searches, and the
classic model's tests run each command with each (tests/decoding/test_translate.py,
tests/decoding/test_sampling_commands.py, tests/evaluation/test_evaluate.py)."""

import json

import jax
import numpy as np
import pytest

from tests.tiny_run import tiny_run_config
from transformer import evaluate, run_changes, rundir, schema, score, translate, visualize
from transformer.checkpoint import load_model
from transformer.commands import train as trainer
from transformer.configs.tiny import MODERN

# A decoding batch of 8 rows runs at one size (`decoding.next_token.stage_sizes`: it does not
# shrink below 8 rows): each search compiles one loop, not one for 16 rows and one for 8.
# Shrinking batches are the classic model's tests' (tests/decoding).
ONE_STAGE = 8


def _config(num_steps: int, **model):
    config = tiny_run_config(num_steps)
    config.update_from_flattened_dict({**MODERN, 'model.num_kv_heads': 2, 'train.z_loss': 1e-3})
    config.model.update(model)
    return config


@pytest.mark.slow
def test_the_modern_variant_through_every_command(tmp_path, capsys):
    first, resumed = {}, {}
    run = tmp_path / 'run'
    # One device: the z-loss and the resume do not depend on how many share the batch, and one
    # device's programs compile faster than the 8 host devices' (tests/compiles.py).
    one = jax.devices()[:1]
    trainer.train_and_evaluate(_config(2), str(run), devices=one, on_step=first.__setitem__)
    trainer.train_and_evaluate(_config(4), str(run), devices=one, on_step=resumed.__setitem__)
    assert sorted(first) == [1, 2] and sorted(resumed) == [3, 4]  # on from the checkpoint
    for metrics in (first | resumed).values():
        assert metrics['z_loss'] > 0 and np.isfinite(metrics['loss'])  # reported on its own
    records = [json.loads(line) for line in open(run / rundir.METRICS_FILE)]
    assert all('z_loss' in r for r in records if r['split'] == 'train')
    config, tokenizer, model, b, _ = load_model(str(run), step=4)
    assert 'query_norm' in b['encoder_layer_0']['self_attention']
    assert b['decoder_layer_0']['ffn'].keys() == {'wi_0', 'wi_1', 'wo'}

    with pytest.raises(SystemExit) as info:
        evaluate.cli(
            ['evaluate', f'--workdir={run}', '--max_examples=5', '--output=']
            + [f'--batch_size={ONE_STAGE}']
        )
    assert not info.value.code
    source, out = tmp_path / 'in.txt', tmp_path / 'out.txt'
    source.write_text('ze bix pud .\nze pud .\n')
    with pytest.raises(SystemExit) as info:
        translate.cli(
            ['translate', f'--workdir={run}', f'--input={source}', f'--output={out}']
            + ['--sampling', '--seed=1', f'--batch_size={ONE_STAGE}']
        )
    assert not info.value.code and len(out.read_text().splitlines()) == 2
    scores = tmp_path / 'scores.tsv'
    with pytest.raises(SystemExit) as info:
        score.cli(
            ['score', f'--workdir={run}', f'--source={source}', f'--target={source}']
            + [f'--output={scores}']
        )
    assert not info.value.code
    assert all(float(line.split('\t')[0]) < 0 for line in scores.read_text().splitlines())
    inputs = np.array(tokenizer.encode('ze bix pud .') + [1], np.int32)
    maps = visualize.attention_maps(model, b, inputs, inputs)
    for weights in maps.values():
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)

    changed = _config(6, positions='sinusoidal')
    with pytest.raises(rundir.WorkdirError, match="model.positions='rope', not 'sinusoidal'"):
        run_changes.resume_changes(str(run), schema.parse(changed))
    capsys.readouterr()
