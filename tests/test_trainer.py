"""Loss, train step and data parallelism (pmap / sharding == one device)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer import optim, trainer
from transformer.model import Transformer, TransformerConfig

VOCAB = 32
ROWS, LEN = 8, 12


def _tiny_model() -> Transformer:
    return Transformer(
        TransformerConfig(
            vocab_size=VOCAB,
            d_model=32,
            num_heads=4,
            d_ff=64,
            num_encoder_layers=1,
            num_decoder_layers=1,
            dropout_rate=0.0,
        )
    )


def _packed_batch(seed: int) -> dict[str, np.ndarray]:
    """Rows of two packed examples each, with trailing padding of varying length."""
    rng = np.random.default_rng(seed)
    batch = {k: np.zeros((ROWS, LEN), np.int32) for k in ('inputs', 'targets')}
    for k in ('inputs', 'targets'):
        batch[f'{k}_segmentation'] = np.zeros((ROWS, LEN), np.int32)
        batch[f'{k}_positions'] = np.zeros((ROWS, LEN), np.int32)
    for row in range(ROWS):
        for k in ('inputs', 'targets'):
            first, second = rng.integers(2, 6, size=2)
            lengths = [first, second]
            offset = 0
            for segment, length in enumerate(lengths, start=1):
                tokens = rng.integers(3, VOCAB, size=length)
                tokens[-1] = 1  # EOS
                batch[k][row, offset : offset + length] = tokens
                batch[f'{k}_segmentation'][row, offset : offset + length] = segment
                batch[f'{k}_positions'][row, offset : offset + length] = np.arange(length)
                offset += length
    return batch


def test_label_smoothing_matches_direct_computation():
    """The closed form equals -sum_v q_v log p_v with the smoothed one-hot q built explicitly."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 5, 7)) * 3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 7, size=(2, 5)))
    weights = jnp.asarray(rng.integers(0, 2, size=(2, 5)), jnp.float32)
    eps = 0.1
    q = jax.nn.one_hot(targets, 7) * (1 - eps) + (1 - jax.nn.one_hot(targets, 7)) * eps / 6
    direct = -(q * jax.nn.log_softmax(logits)).sum(-1)
    loss, nll = trainer.cross_entropy_with_smoothing(logits, targets, weights, eps)
    np.testing.assert_allclose(loss, (direct * weights).sum(), rtol=1e-5)
    plain = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, (plain * weights).sum(), rtol=1e-5)
    loss0, nll0 = trainer.cross_entropy_with_smoothing(logits, targets, weights, 0.0)
    np.testing.assert_allclose(loss0, nll0, rtol=1e-6)


def test_smoothed_loss_is_finite_and_floor_is_its_minimum():
    """Extreme logits give a finite loss; logits = log q reach exactly the constant floor."""
    targets = jnp.array([[2, 0]])
    weights = jnp.ones((1, 2))
    huge = jnp.where(jax.nn.one_hot(targets, 5) > 0, 1e4, -1e4)
    loss, _ = trainer.cross_entropy_with_smoothing(huge, targets, weights, 0.1)
    assert np.isfinite(loss)
    q = jax.nn.one_hot(targets, 5) * 0.9 + (1 - jax.nn.one_hot(targets, 5)) * 0.1 / 4
    best, _ = trainer.cross_entropy_with_smoothing(jnp.log(q), targets, weights, 0.1)
    np.testing.assert_allclose(best / 2, trainer.smoothing_floor(5, 0.1), rtol=1e-5)
    assert trainer.smoothing_floor(5, 0.0) == 0.0


def _run(mode: str, devices, accum: int, steps: int = 3):
    model = _tiny_model()
    opt = base.get_config().opt
    opt.warmup_steps = 10
    tx, schedule = optim.make_optimizer(opt, d_model=32)
    parallel = trainer.Parallel(
        mode,
        model=model,
        tx=tx,
        schedule=schedule,
        label_smoothing=0.1,
        accum_steps=accum,
        devices=devices,
    )
    state = parallel.put_state(trainer.init_state(model, tx, jax.random.key(0), LEN))
    losses = []
    for step in range(steps):
        state, sums = parallel.train_step(state, _packed_batch(step), jax.random.key(1))
        sums = jax.device_get(sums)
        loss = np.asarray(sums['loss']).reshape(-1)[0] / np.asarray(sums['tokens']).reshape(-1)[0]
        losses.append(loss)
    return np.array(losses), jax.device_get(parallel.get_state(state).params)


@functools.cache
def _reference():
    return _run('sharding', jax.devices()[:1], accum=1)


@pytest.mark.parametrize(
    'mode,num_devices,accum',
    [('pmap', 8, 1), ('sharding', 8, 1), ('pmap', 4, 2), ('sharding', 1, 4)],
)
def test_data_parallel_equals_one_device(mode, num_devices, accum):
    """Same global batch -> same losses and parameters after 3 steps on 1 or 8 devices, with
    or without gradient accumulation (the loss is normalised by the global token count)."""
    assert len(jax.devices()) == 8, 'conftest should give 8 CPU devices'
    ref_losses, ref_params = _reference()
    losses, params = _run(mode, jax.devices()[:num_devices], accum)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < losses[0]  # it learns: the comparison is not between frozen models
    for ref, got in zip(jax.tree.leaves(ref_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


def test_sharding_mode_splits_heads_on_the_model_axis():
    """With a 'model' axis of 2, q/k/v kernels are split on N and out kernels on N."""
    mesh = trainer.make_mesh(2, jax.devices()[:4])
    model = _tiny_model()
    tx, _ = optim.make_optimizer(base.get_config().opt, d_model=32)
    state = trainer.init_state(model, tx, jax.random.key(0), LEN)
    shardings = trainer.state_shardings(mesh, state)
    attn = shardings.params['encoder_layer_0']['self_attention']
    assert attn['query']['kernel'].spec == jax.sharding.PartitionSpec(None, 'model', None)
    assert attn['out']['kernel'].spec == jax.sharding.PartitionSpec('model', None, None)
    mu = shardings.opt_state[-1][0].mu['encoder_layer_0']['self_attention']['key']['kernel']
    assert mu.spec == jax.sharding.PartitionSpec(None, 'model', None)
    placed = jax.device_put(state, shardings)
    kernel = placed.params['encoder_layer_0']['self_attention']['query']['kernel']
    assert kernel.addressable_shards[0].data.shape == (32, 2, 8)  # half of the 4 heads


def _tiny_run_config(num_steps: int):
    """configs/tiny.py shrunk to seconds: the same code path as the README command."""
    from configs import tiny

    config = tiny.get_config()
    config.model.d_model = 32
    config.model.num_heads = 4
    config.model.d_ff = 64
    config.model.num_encoder_layers = 1
    config.model.num_decoder_layers = 1
    config.model.dropout_rate = 0.1  # exercise the dropout key path in resume
    config.model.max_len = 32
    config.data.max_len = 32
    config.data.synthetic.num_train = 200
    config.data.synthetic.num_validation = 20
    config.data.synthetic.num_test = 20
    config.data.vocab_size = 300
    config.train.batch_size = 8
    config.train.num_steps = num_steps
    config.train.log_every = 1
    config.train.eval_every = 0
    config.train.checkpoint_every = 3
    config.train.async_checkpointing = False
    config.eval.batch_size = 16
    return config


def _params_at(workdir, step):
    from transformer import evaluate

    _, _, _, params, _ = evaluate.load_model(str(workdir), step=step)
    return params


def test_resume_continues_exactly(tmp_path):
    """3 steps, stop, restart to 6 == 6 uninterrupted steps: same losses (so the same batches
    and dropout masks) and the same final parameters."""
    straight, first, resumed = {}, {}, {}
    trainer.train_and_evaluate(
        _tiny_run_config(6), str(tmp_path / 'a'), on_step=lambda s, m: straight.update({s: m})
    )
    trainer.train_and_evaluate(
        _tiny_run_config(3), str(tmp_path / 'b'), on_step=lambda s, m: first.update({s: m})
    )
    final = trainer.train_and_evaluate(
        _tiny_run_config(6), str(tmp_path / 'b'), on_step=lambda s, m: resumed.update({s: m})
    )
    assert sorted(first) == [1, 2, 3] and sorted(resumed) == [4, 5, 6]
    assert final['steps_this_run'] == 3
    for step in range(1, 7):
        got = (first | resumed)[step]['loss']
        np.testing.assert_allclose(got, straight[step]['loss'], rtol=1e-6, err_msg=f'step {step}')
    a, b = _params_at(tmp_path / 'a', 6), _params_at(tmp_path / 'b', 6)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_resume_with_another_model_is_a_clear_error_and_keeps_the_run(tmp_path):
    """Restarting a workdir with a changed model fails with one line and leaves the saved
    config and checkpoints as they were."""
    trainer.train_and_evaluate(_tiny_run_config(3), str(tmp_path))
    saved_config = (tmp_path / 'config.json').read_text()
    changed = _tiny_run_config(6)
    changed.model.d_ff = 48
    with pytest.raises(trainer.TrainingError, match='does not fit this config') as info:
        trainer.train_and_evaluate(changed, str(tmp_path))
    assert '\n' not in str(info.value)
    assert (tmp_path / 'config.json').read_text() == saved_config
    assert np.isfinite(jax.tree.leaves(_params_at(tmp_path, 3))[0]).all()


def test_train_py_smoke(tmp_path, monkeypatch):
    """`python train.py --config configs/tiny.py` end to end for a few steps, in-process:
    it writes the config, vocabulary, metrics (JSONL + TensorBoard, validation loss and BLEU)
    and checkpoints."""
    import json
    import sys

    workdir = tmp_path / 'run'
    argv = ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}']
    overrides = {
        'model.d_model': 32,
        'model.d_ff': 64,
        'model.num_encoder_layers': 1,
        'model.num_decoder_layers': 1,
        'model.max_len': 32,
        'data.max_len': 32,
        'data.synthetic.num_train': 200,
        'data.synthetic.num_validation': 20,
        'data.synthetic.num_test': 20,
        'data.vocab_size': 300,
        'train.batch_size': 8,
        'train.num_steps': 4,
        'train.log_every': 2,
        'train.checkpoint_every': 2,
        'eval.batch_size': 16,
        'eval.bleu_every': 4,
        'eval.bleu_max_examples': 5,
        'eval.beam_size': 2,
    }
    argv += [f'--config.{k}={v}' for k, v in overrides.items()]
    # ml_collections registers the --config.x.y override flags from sys.argv.
    monkeypatch.setattr(sys, 'argv', argv)
    with pytest.raises(SystemExit) as exit_info:
        trainer.cli(argv)
    assert not exit_info.value.code, exit_info.value.code
    records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
    train_steps = [r['step'] for r in records if r['split'] == 'train']
    assert train_steps == [2, 4]
    assert any(r['split'] == 'validation' and r['step'] == 4 and 'loss' in r for r in records)
    bleu = [r for r in records if 'sacrebleu' in r]  # validation BLEU through evaluate's code
    assert [r['step'] for r in bleu] == [4] and 0.0 <= bleu[0]['sacrebleu'] <= 100.0
    assert all(np.isfinite(r['loss']) for r in records if 'loss' in r)
    assert json.loads((workdir / 'config.json').read_text())['train']['num_steps'] == 4
    assert (workdir / 'vocab' / 'spm.model').exists()
    assert sorted(p.name for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()) == [
        '2',
        '4',
    ]
    assert list((workdir / 'tensorboard').iterdir())


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    """A learning rate that blows up stops the run with a clear error; the checkpoint saved
    before the blow-up is still there and loads."""
    config = _tiny_run_config(30)
    config.opt.schedule = 'constant'
    config.opt.lr_scale = 1e12
    config.train.checkpoint_every = 1
    config.train.log_every = 1
    with pytest.raises(trainer.TrainingError, match='Non-finite'):
        trainer.train_and_evaluate(config, str(tmp_path))
    from transformer import evaluate

    steps = evaluate.checkpoint_steps(str(tmp_path), average_last=100)
    assert steps, 'a good checkpoint must survive'
    params = _params_at(tmp_path, steps[-1])
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_bfloat16_compute_keeps_float32_params():
    """model.dtype='bfloat16' computes in bfloat16 (close to the float32 loss) while the
    parameters and optimizer state stay float32."""
    opt = base.get_config().opt
    tx, schedule = optim.make_optimizer(opt, d_model=32)
    losses = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        model = Transformer(dataclasses.replace(_tiny_model().config, dtype=dtype))
        state = trainer.init_state(model, tx, jax.random.key(0), LEN)
        state, sums = jax.jit(
            functools.partial(
                trainer.train_step,
                model=model,
                tx=tx,
                schedule=schedule,
                label_smoothing=0.1,
                accum_steps=1,
            )
        )(state, _packed_batch(0), jax.random.key(1))
        losses[dtype] = float(sums['loss'] / sums['tokens'])
        assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype('float32')}
    assert losses[jnp.bfloat16] != losses[jnp.float32]  # it did compute in bfloat16
    np.testing.assert_allclose(losses[jnp.bfloat16], losses[jnp.float32], rtol=2e-2)
