"""The evaluate command and validation on a mesh: the shared tiny run evaluated on 1 device,
on 8 (data only) and with a model axis of 2; a run trained with FSDP validated and evaluated
with its parameters sharded as in training, and with ``--gather_params``."""

import json

import jax
import numpy as np
import pytest

from tests.tiny_run import DECODE_BATCH, tiny_run_config
from transformer import evaluate
from transformer.commands import decoding_run
from transformer.commands import train as trainer
from transformer.training import validation

KERNEL = ('encoder_layer_0', 'self_attention', 'query', 'kernel')  # [D, N, H]


def _kernel(params):
    for key in KERNEL:
        params = params[key]
    return params


def _evaluate(run, out, **kwargs) -> tuple[dict, list[str]]:
    """Greedy: after 4 steps beam search gives every sentence the same translation; greedy's
    differ (beam search on a mesh: tests/decoding/test_mesh.py)."""
    scores = evaluate.run(str(run), step=4, beam_size=1, output=str(out), **kwargs)
    return scores, out.read_text().splitlines()


@pytest.mark.slow
def test_evaluate_on_eight_devices_and_a_model_axis_equals_one_device(run_dir, tmp_path):
    """Token-identical hypotheses (and so scores) on 1 device, 8 devices (data only) and a
    (4 data x 2 model) mesh; the JSON says where the sentences were decoded."""
    cpu = jax.devices('cpu')
    # The 20 sentences in one batch: one shape, and on either mesh one stage of the search (20
    # rows, padded to 24 on 8 data devices, do not halve into whole shares of the data axis;
    # eval.batch_size's 16 halve into a second loop to compile).
    kwargs = dict(batch_size=20)
    one, one_lines = _evaluate(run_dir, tmp_path / 'one.txt', devices=cpu[:1], **kwargs)
    eight, eight_lines = _evaluate(run_dir, tmp_path / 'eight.txt', devices=cpu, **kwargs)
    model2, model2_lines = _evaluate(
        run_dir, tmp_path / 'm.txt', devices=cpu, model_parallelism=2, **kwargs
    )
    assert len(set(one_lines)) > 1  # the sentences' translations differ: a real comparison
    assert eight_lines == one_lines and model2_lines == one_lines
    assert eight['sacrebleu'] == one['sacrebleu'] == model2['sacrebleu']
    assert (one['devices'], eight['devices'], eight['processes']) == (1, 8, 1)
    assert (eight['mesh'], model2['mesh']) == ({'data': 8, 'model': 1}, {'data': 4, 'model': 2})
    assert one['sentences_per_process'] == eight['sentences_per_process'] == [20]
    written = json.loads((tmp_path / 'eight.json').read_text())
    assert written['devices'] == 8 and written['sentences_per_process'] == [20]


@pytest.mark.slow
def test_a_run_trained_with_fsdp_decodes_with_its_parameters_sharded(tmp_path, monkeypatch):
    """Validation's loss and BLEU get the parameters FSDP-sharded over the 8 devices (asserted
    on the arrays each receives); evaluate restores them sharded from the run's config, and
    with ``gather_params`` (replicated) writes the same hypotheses; one device agrees."""
    seen = []
    for name in ('loss', 'bleu'):
        original = getattr(validation.Validation, name)

        def spy(self, params, original=original, name=name):
            seen.append((name, _kernel(params).sharding))
            return original(self, params)

        monkeypatch.setattr(validation.Validation, name, spy)
    config = tiny_run_config(4)
    config.train.fsdp = True
    config.train.eval_every = 4
    config.eval.bleu_every = 4
    # Greedy on a few sentences: what is checked is the layout validation's decoding gets.
    config.eval.beam_size = 1
    config.eval.bleu_max_examples = DECODE_BATCH
    config.eval.batch_size = DECODE_BATCH  # one batch of them: one loop to compile
    run = tmp_path / 'run'
    cpu = jax.devices('cpu')
    trainer.train_and_evaluate(config, str(run), devices=cpu)
    assert [name for name, _ in seen] == ['loss', 'bleu']
    for _, sharding in seen:
        assert len(sharding.device_set) == 8 and sharding.spec[0] == 'data'

    loaded = decoding_run.load_run(str(run), step=4, devices=cpu)
    restored = _kernel(loaded.params).sharding
    assert restored.spec[0] == 'data' and not restored.is_fully_replicated
    gathered = decoding_run.load_run(str(run), step=4, devices=cpu, gather_params=True)
    assert _kernel(gathered.params).sharding.is_fully_replicated

    # Validation's sentences in its batch: each layout's search compiles one loop for one shape.
    few = dict(max_examples=DECODE_BATCH, batch_size=DECODE_BATCH)
    sharded, sharded_lines = _evaluate(run, tmp_path / 'fsdp.txt', devices=cpu, **few)
    full, full_lines = _evaluate(run, tmp_path / 'full.txt', devices=cpu, gather_params=True, **few)
    one, one_lines = _evaluate(run, tmp_path / 'one.txt', devices=cpu[:1], fsdp=False, **few)
    assert len(set(one_lines)) > 1
    assert sharded_lines == full_lines == one_lines
    assert sharded['sacrebleu'] == full['sacrebleu'] == one['sacrebleu']


@pytest.mark.slow
def test_checkpoints_are_averaged_straight_into_a_sharded_layout(run_dir):
    """Steps 2 and 4 restored FSDP-sharded over 8 devices and averaged shard by shard: the
    same bits as the average on one device, and still sharded."""
    cpu = jax.devices('cpu')
    one = decoding_run.load_run(str(run_dir), average_last=2, devices=cpu[:1])
    fsdp = decoding_run.load_run(str(run_dir), average_last=2, devices=cpu, fsdp=True)
    assert one.member_steps == fsdp.member_steps == [[2, 4]]
    sharding = _kernel(fsdp.params).sharding
    assert sharding.spec[0] == 'data' and len(sharding.device_set) == 8
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(fsdp.params), strict=True):
        assert b.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
