"""train.init_from: fine-tuning starts from a MarianMT's or a run's parameters and vocabulary."""

import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests.compiles import compiled_programs
from tests.marian_dir import TRAINED_LINES, marian_dir, synthetic_lines
from tests.shared_dirs import built_once
from tests.tiny_run import file_hashes, tiny_run_config
from transformer import rundir
from transformer.checkpoint import load_model
from transformer.commands import convert
from transformer.commands import train as trainer
from transformer.data import DataError
from transformer.interop.marian_vocab import MarianVocabulary
from transformer.training import TrainingError, init_from, train_and_evaluate

pytest.importorskip('torch', reason="torch is not installed: pip install -e '.[export]'")
pytest.importorskip(
    'transformers', reason="transformers is not installed: pip install -e '.[export]'"
)


def _config(num_steps: int, init: str | None, folder: str, **train):
    """The tiny config on ``folder``'s lines."""
    config = tiny_run_config(num_steps)
    config.data.update(dataset='folder', folder=folder)
    config.train.update(init_from=init, checkpoint_every=2, **train)
    config.eval.bleu_every = 0  # the final validation computes its loss alone
    config.opt.update(schedule='constant', lr_scale=1e-3)
    return config


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory)


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """The lines the MarianMT fixture learned, as a folder dataset that validates and tests on
    the first 8 of them (one evaluation batch: each run's final validation compiles one
    program, where the 32 lines' two lengths compiled two); one folder for all workers
    (`finetuned`'s config names it)."""

    def write(path):
        path.mkdir()
        for split, count in (('train', TRAINED_LINES), ('validation', 8), ('test', 8)):
            pairs = synthetic_lines()[:count]
            (path / f'{split}.en').write_text(''.join(s + '\n' for s, _ in pairs))
            (path / f'{split}.de').write_text(''.join(t + '\n' for _, t in pairs))

    return str(built_once(tmp_path_factory, 'init_from_lines', write))


@pytest.fixture(scope='module')
def finetuned(hf_dir, folder, tmp_path_factory):
    """(workdir, first losses): 4 steps from the MarianMT; trained once for all workers (read
    it only: a test that trains on copies it)."""

    def train(path):
        path.mkdir()
        seen: list[float] = []
        config = _config(4, hf_dir, folder)
        with compiled_programs() as programs:
            train_and_evaluate(
                config, str(path / 'run'), on_step=lambda s, m: seen.append(m['loss'])
            )
        record = {'pretrained': seen[0], 'programs': programs}
        (path / 'losses.json').write_text(json.dumps(record))

    path = built_once(tmp_path_factory, 'init_from_finetuned', train)
    return str(path / 'run'), json.loads((path / 'losses.json').read_text())


@pytest.mark.slow
def test_first_loss_is_the_pretrained_models(finetuned, hf_dir):
    """The first loss is far below a uniform guess over the vocabulary, log(V): the loss a
    model trained from nothing starts at or above (5.9 against log(277) = 5.6 here)."""
    workdir, losses = finetuned
    pieces = len(json.load(open(rundir.path(workdir, 'vocab', 'vocab.json'))))
    assert losses['pretrained'] < 0.5 * np.log(pieces), losses
    with open(rundir.path(workdir, 'config.json')) as f:
        config = json.load(f)
    assert config['train']['init_from'] == hf_dir
    assert config['model']['ffn'] == 'swish' and config['model']['d_model'] == 32
    assert os.path.isfile(rundir.path(workdir, 'vocab', 'vocab.json'))


@pytest.mark.slow
def test_the_start_is_not_drawn_at_random_first(finetuned):
    """The fine-tune's state is the start's parameters with a fresh optimizer state for them
    (`init_from.init_state`): the random initialiser a run from nothing compiles is not
    compiled (its parameters would be thrown away, after holding a second copy of the model)."""
    programs = finetuned[1]['programs']
    assert 'jit(fresh_state)' in programs, programs
    assert not any('init' in name for name in programs), programs


@pytest.mark.slow
def test_the_output_bias_stays_frozen_and_the_rest_trains(finetuned, hf_dir):
    from transformer.interop import marian

    workdir, _ = finetuned
    start = marian.load(hf_dir).params
    params = load_model(workdir, step=4, average_last=1)[3]
    np.testing.assert_array_equal(np.asarray(params['logits_bias']), start['logits_bias'])
    moved = np.abs(
        np.asarray(params['shared_embedding']['embedding']) - start['shared_embedding']['embedding']
    )
    assert moved.max() > 1e-5


@pytest.mark.slow
def test_a_run_resumes_and_run_at_step_takes_that_step(finetuned, hf_dir, folder, tmp_path):
    workdir = str(shutil.copytree(finetuned[0], tmp_path / 'run'))  # the shared run: read only
    final = train_and_evaluate(_config(6, hf_dir, folder), workdir)  # the same command, longer
    assert final['step'] == 6 and final['steps_this_run'] == 2
    assert [c['key'] for c in rundir.read_history(workdir)] == ['train.num_steps']
    start = init_from.read_start(f'{workdir}@2')
    assert start.step == 2 and isinstance(start.tokenizer, MarianVocabulary)
    abstract = load_model(workdir, step=2, average_last=1)[3]
    import jax

    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), abstract
    )
    at2 = init_from.start_params(start, shapes)
    latest = load_model(workdir, step=4, average_last=1)[3]
    emb = lambda p: np.asarray(p['shared_embedding']['embedding'])  # noqa: E731
    np.testing.assert_array_equal(emb(at2), emb(abstract))
    assert not np.array_equal(emb(at2), emb(latest))


def test_a_model_override_with_init_from_stops_before_writing(hf_dir, folder, tmp_path):
    config = _config(2, hf_dir, folder)
    config.model.d_model = 64
    workdir = tmp_path / 'run'
    with pytest.raises(TrainingError, match=r'model.d_model=64 changes the model') as info:
        train_and_evaluate(config, str(workdir), overridden=['model.d_model'])
    assert '\n' not in str(info.value)
    assert not workdir.exists()


def test_free_fields_may_change_with_init_from(hf_dir, folder, tmp_path):
    config = _config(1, hf_dir, folder)
    config.model.dropout_rate = 0.3
    from transformer import schema

    merged, start = init_from.apply(schema.parse(config), str(tmp_path), ['model.dropout_rate'])
    assert merged.model.dropout_rate == 0.3 and merged.model.ffn == 'swish'
    assert start.tokenizer.vocab_size == merged.data.vocab_size


def test_train_on_a_converted_run_points_to_init_from(hf_dir, folder, tmp_path):
    workdir = str(tmp_path / 'converted')
    convert.convert(hf_dir, workdir)
    before = sorted(os.listdir(workdir))
    with pytest.raises(TrainingError, match=r'train.init_from=') as info:
        train_and_evaluate(_config(2, None, folder), workdir)
    assert '\n' not in str(info.value) and 'new --workdir' in str(info.value)
    assert sorted(os.listdir(workdir)) == before


def test_train_into_a_marian_directory_is_refused_with_its_files_unchanged(
    hf_dir, folder, tmp_path, monkeypatch
):
    """A user who forgot train.init_from and gave the pretrained directory as --workdir: it
    is named, with how to fine-tune it, and every file of it stays as it was."""
    from transformer.training import prepare_data

    pretrained = tmp_path / 'opus-mt'
    shutil.copytree(hf_dir, pretrained)
    before = file_hashes(pretrained)
    config = _config(2, None, folder)
    config.train.init_from_required = True  # as configs/multi30k.py:finetune
    for command in (train_and_evaluate, prepare_data):
        with pytest.raises(TrainingError) as info:
            command(config, str(pretrained))
        assert str(info.value) == (
            f"{pretrained} holds a Hugging Face model (model_type 'marian'), not a run: "
            f'fine-tune it with --config.train.init_from={pretrained} and a new --workdir.'
        )
        assert file_hashes(pretrained) == before
    # The command as typed: python train.py --config configs/multi30k.py:finetune --workdir DIR
    argv = ['train', '--config=multi30k:finetune', f'--workdir={pretrained}']
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its overrides from sys.argv
    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    with pytest.raises(SystemExit) as exit_info:
        trainer.cli(argv)
    assert exit_info.value.code == f'error: {info.value}'
    assert file_hashes(pretrained) == before


def test_a_mix_tag_the_start_lacks_stops_before_the_workdir_is_made(hf_dir, folder, tmp_path):
    config = _config(2, hf_dir, folder)
    config.data.mix = f'own={folder},bt={folder}:<bt>'
    workdir = tmp_path / 'run'
    with pytest.raises(DataError, match=r"data.mix entry 'bt'='<bt>' is not a token"):
        train_and_evaluate(config, str(workdir))
    assert not workdir.exists()


@pytest.fixture(scope='module')
def separate_dir(tmp_path_factory):
    """A MarianMT with separate vocabularies (tests/test_convert_separate.py)."""
    return marian_dir(tmp_path_factory, separate_vocabs=True)


@pytest.mark.slow
def test_separate_vocabularies_fine_tune_from_the_weights(separate_dir, folder, tmp_path):
    """One step from a MarianMT with separate vocabularies (label smoothing off): its first
    loss is the pretrained model's on the lines it learned, far below a uniform guess over
    the target's pieces, and the unshared tables keep their shapes."""
    seen: list[float] = []
    config = _config(1, separate_dir, folder, label_smoothing=0.0)
    workdir = str(tmp_path / 'run')
    train_and_evaluate(config, workdir, on_step=lambda s, m: seen.append(m['loss']))
    target = len(json.load(open(os.path.join(separate_dir, 'target_vocab.json'))))
    assert seen[0] < 0.25 * np.log(target), seen
    params = load_model(workdir, average_last=1)[3]
    assert 'shared_embedding' not in params
    assert params['target_embedding']['embedding'].shape == (147, 32)


def test_separate_vocabularies_with_label_smoothing_stop_before_writing(
    separate_dir, folder, tmp_path
):
    workdir = tmp_path / 'run'
    with pytest.raises(TrainingError, match=r'label_smoothing=0.1 .*set ') as info:
        train_and_evaluate(_config(1, separate_dir, folder), str(workdir))
    assert '\n' not in str(info.value)
    assert not workdir.exists()


@pytest.mark.parametrize('mode', ['pmap', 'fsdp'])
def test_a_start_takes_each_layouts_shardings_with_a_fresh_optimizer(run_dir, mode):
    """`init_from.init_state` of a run directory (conftest's run, step 4) on 8 devices, in the
    layouts whose states are placed differently: the start's parameters, step 0, Adam's
    moments zero, every leaf in the layout's sharding."""
    import dataclasses
    import functools

    import jax

    from transformer.training import optim, steps
    from transformer.training.parallel import Parallel

    config = rundir.read_config(str(run_dir))
    train = dataclasses.replace(config.train, parallelism='pmap' if mode == 'pmap' else 'sharding')
    config = dataclasses.replace(config, train=dataclasses.replace(train, fsdp=mode == 'fsdp'))
    start = init_from.read_start(str(run_dir))
    model = steps.build_model(config, start.tokenizer.vocab_size)
    tx, schedule = optim.make_optimizer(config.opt, config.model.d_model, 4)
    parallel = Parallel.from_config(config, model, tx, schedule, jax.devices('cpu'))
    init = functools.partial(steps.init_state, model, tx, jax.random.key(0), config.data.max_len)
    state = init_from.init_state(start, parallel, init, tx)
    want = load_model(str(run_dir), step=4, average_last=1)[3]
    for got, saved in zip(jax.tree.leaves(state.params), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(saved))
    assert int(state.step) == 0
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(state.opt_state))
    for leaf, sharding in zip(
        jax.tree.leaves(state), jax.tree.leaves(parallel.shardings), strict=True
    ):
        assert leaf.sharding == sharding
