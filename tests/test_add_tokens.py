"""Tokens added to a MarianMT vocabulary (convert's --add_tokens, train.add_tokens): new rows
at the end, the old function untouched, and a tagged mix fine-tunes and exports with them."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.cli import convert_cli
from tests.marian_dir import TRAINED_LINES, marian_dir, synthetic_lines
from tests.tiny_run import DECODE_BATCH, tiny_run_config
from transformer import api, export, rundir
from transformer.checkpoint import load_model
from transformer.training import TrainingError, train_and_evaluate

_SKIP = "{} is not installed: pip install -e '.[export]'"
pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

TAGS = '<bt>,<ft>=<unk>'


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory)


@pytest.fixture(scope='module')
def converted(hf_dir, tmp_path_factory):
    """The run directories of one MarianMT converted without and with the two tokens."""
    out = tmp_path_factory.mktemp('added')
    assert convert_cli(f'--from_hf={hf_dir}', f'--workdir={out / "plain"}') is None
    assert (
        convert_cli(f'--from_hf={hf_dir}', f'--workdir={out / "tags"}', f'--add_tokens={TAGS}')
        is None
    )
    return out / 'plain', out / 'tags'


@pytest.fixture(scope='module')
def runs(converted):
    """(loaded without, loaded with the two tokens) of one MarianMT."""
    return tuple(load_model(str(run)) for run in converted)


def test_new_rows_are_the_mean_or_the_named_row_and_old_rows_stay(runs):
    (_, plain_vocab, _, plain, _), (config, vocab, _, params, _) = runs
    size = plain_vocab.vocab_size
    assert vocab.vocab_size == config.data.vocab_size == size + 2
    assert [vocab.token_id('<bt>'), vocab.token_id('<ft>')] == [size, size + 1]
    assert vocab.fingerprint != plain_vocab.fingerprint  # token caches are not shared
    for rows in (
        lambda p: np.asarray(p['shared_embedding']['embedding']),
        lambda p: np.asarray(p['logits_bias']),
    ):
        old, new = rows(plain), rows(params)
        np.testing.assert_array_equal(new[:size], old)
        np.testing.assert_allclose(new[size], old.mean(0), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(new[size + 1], old[vocab.token_id('<unk>')])
    rest = lambda p: {k: v for k, v in p.items() if k not in ('shared_embedding', 'logits_bias')}  # noqa: E731
    jax.tree.map(np.testing.assert_array_equal, rest(plain), rest(params))


@pytest.mark.slow
def test_log_probs_without_the_tags_change_only_by_the_new_entries(runs):
    """On lines without the tags, the first V logits are the conversion's without them (to
    1e-5); its log-probabilities are those minus log(1 + the two new entries' probability
    mass), i.e. the softmax only gains two entries."""
    (_, plain_vocab, model0, plain, _), (_, vocab, model, params, _) = runs
    pairs = synthetic_lines()[:8]
    rows = lambda ids: np.array([r + [0] * (24 - len(r)) for r in ids])  # noqa: E731
    sources = rows(vocab.encode_batch([s for s, _ in pairs]))
    targets = rows(vocab.encode_batch([t for _, t in pairs], 'target'))
    assert (sources == rows(plain_vocab.encode_batch([s for s, _ in pairs]))).all()
    with jax.default_matmul_precision('float32'):
        # Each compiled as one program: eagerly, each operation compiles on its own.
        old = np.asarray(
            jax.jit(model0.apply)({'params': plain}, jnp.asarray(sources), jnp.asarray(targets))
        )
        new = np.asarray(
            jax.jit(model.apply)({'params': params}, jnp.asarray(sources), jnp.asarray(targets))
        )
    size = plain_vocab.vocab_size
    np.testing.assert_allclose(new[..., :size], old, rtol=0, atol=1e-5)
    old_lp, new_lp = jax.nn.log_softmax(old, -1), jax.nn.log_softmax(new, -1)
    mass = np.exp(np.asarray(new_lp[..., size:])).sum(-1, keepdims=True)
    np.testing.assert_allclose(new_lp[..., :size], old_lp + np.log1p(-mass), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    'spec, message',
    [
        ('<unk>', r"'<unk>' is already a token of the vocabulary"),
        ('▁', r"'▁' is already a token"),
        ('<bt>,<bt>', r"names '<bt>' twice"),
        ('<bt>=<nope>', r"'<nope>' is not a token of the vocabulary"),
        ('<bt>,', r"'' is not NAME or NAME=LIKE"),
    ],
)
def test_bad_tokens_stop_in_one_line_and_write_nothing(hf_dir, tmp_path, spec, message):
    import re

    out = tmp_path / 'run'
    text = convert_cli(f'--from_hf={hf_dir}', f'--workdir={out}', f'--add_tokens={spec}')
    assert re.search(message, text) and '\n' not in text, text
    assert not out.exists() and os.listdir(tmp_path) == []


def _config(folder: str, num_steps: int, **train):
    config = tiny_run_config(num_steps)
    config.data.update(dataset='folder', folder=folder, mix=f'bt={folder}:<bt>,ft={folder}:<ft>')
    config.train.update(checkpoint_every=2, **train)
    config.eval.bleu_every = 0
    config.opt.update(schedule='constant', lr_scale=1e-2)
    return config


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """The lines the MarianMT was trained on; the first 8 of them to validate and test (one
    evaluation batch: each run's final validation compiles one program)."""
    path = tmp_path_factory.mktemp('lines')
    for split, count in (('train', TRAINED_LINES), ('validation', 8), ('test', 8)):
        pairs = synthetic_lines()[:count]
        (path / f'{split}.en').write_text(''.join(s + '\n' for s, _ in pairs))
        (path / f'{split}.de').write_text(''.join(t + '\n' for _, t in pairs))
    return str(path)


def test_a_tagged_mix_needs_the_tokens_added(hf_dir, folder, tmp_path):
    with pytest.raises(
        Exception, match=r"'<bt>' is not a token .* train.add_tokens='<bt>'"
    ) as info:
        train_and_evaluate(_config(folder, 1, init_from=hf_dir), str(tmp_path / 'run'))
    assert '\n' not in str(info.value)


def test_add_tokens_on_a_sentencepiece_run_is_refused(run_dir, folder):
    """A run of this project's joint SentencePiece vocabulary (conftest's ``run_dir``)."""
    from transformer import schema
    from transformer.training import init_from

    config = schema.parse(_config(folder, 1, init_from=str(run_dir), add_tokens='<bt>'))
    with pytest.raises(TrainingError, match=r'cannot grow') as info:
        init_from.apply(config, str(run_dir) + '-2')
    assert '\n' not in str(info.value)


@pytest.mark.slow
def test_a_tagged_mix_fine_tunes_and_the_export_maps_each_tag_to_its_row(hf_dir, folder, tmp_path):
    from transformer import schema
    from transformer.training import workdir_checks

    workdir = str(tmp_path / 'run')
    # Two steps, a checkpoint each: the two that average_last=2 averages (each further step
    # and save cost seconds and no assertion).
    config = _config(folder, 2, init_from=hf_dir, add_tokens=TAGS)
    config.train.checkpoint_every = 1
    # One device: the tags' rows train alike on any number, and one device's programs compile
    # faster than the 8 host devices' (tests/compiles.py).
    train_and_evaluate(config, workdir, devices=jax.devices()[:1])
    # A resume with the same tokens passes every check a resume makes before it writes (one
    # with other tokens is refused below), without compiling the training step again.
    checked = workdir_checks.before_writing(schema.parse(config), workdir)
    assert checked.config.data.vocab_size == checked.start.tokenizer.vocab_size + 2
    _, vocab, _, params, _ = load_model(workdir, average_last=2)
    from transformer.interop import marian

    pretrained = marian.load(hf_dir).params['shared_embedding']['embedding']
    initial = {'<bt>': pretrained.mean(0), '<ft>': pretrained[vocab.token_id('<unk>')]}
    out = str(tmp_path / 'hf')
    export.export(workdir, out, format='hf', average_last=2)
    tokenizer = transformers.MarianTokenizer.from_pretrained(out)
    model = transformers.MarianMTModel.from_pretrained(out)
    embedding = model.get_input_embeddings().weight.detach().numpy()
    ours = np.asarray(params['shared_embedding']['embedding'])
    for tag in ('<bt>', '<ft>'):
        ids = tokenizer(f'{tag} {synthetic_lines()[0][0]}').input_ids  # Hugging Face's
        ours_id = vocab.token_id(tag)
        assert ids[0] == vocab.marian_id(ours_id) == len(tokenizer) - (2 if tag == '<bt>' else 1)
        line = synthetic_lines()[0][0]
        ours_ids = vocab.encode(f'{tag} {line}')  # the tag's string maps to its id, as HF's
        assert ours_ids == [ours_id, *vocab.encode(line)]
        assert ids[:-1] == [vocab.marian_id(i) for i in ours_ids]
        np.testing.assert_allclose(embedding[ids[0]], _marian_channels(ours[ours_id]), atol=1e-6)
        assert np.abs(ours[ours_id] - initial[tag]).max() > 1e-4  # it trained
    with open(rundir.path(workdir, 'config.json')) as f:
        assert json.load(f)['train']['add_tokens'] == TAGS
    changed = _config(folder, 3, init_from=hf_dir, add_tokens='<ft>,<bt>=<unk>')
    with pytest.raises(TrainingError, match=r'train.add_tokens=.*a run keeps its vocabulary'):
        train_and_evaluate(changed, workdir, devices=jax.devices()[:1])


@pytest.mark.slow
def test_ctranslate2_export_with_the_tokens_translates_as_ours(converted, runs, tmp_path):
    """--format ctranslate2 of the run converted with the two tokens: its vocabulary holds
    them at our ids, and CTranslate2's greedy outputs of tagged sources equal ours (each tag
    a token of its own, as our vocabulary cuts its string out of the text)."""
    pytest.importorskip('ctranslate2', reason=_SKIP.format('ctranslate2'))
    import sentencepiece as spm

    from tests import ctranslate2_child

    run_dir, out = converted[1], tmp_path / 'ct2'
    export.export(str(run_dir), str(out), format='ctranslate2')
    # 8 of the learned lines: fewer stages of the greedy search's shrinking batch to compile
    # (a program each) than 32, and enough lines for a tag to change some output.
    lines = [s for s, _ in synthetic_lines()[:8]]
    source = spm.SentencePieceProcessor(model_file=str(out / 'source.spm'))
    target = spm.SentencePieceProcessor(model_file=str(out / 'target.spm'))
    run = api.load(str(run_dir), devices=jax.devices()[:1])  # one device's faster compiles
    pieces = json.loads((out / 'shared_vocabulary.json').read_text(encoding='utf-8'))
    vocab = runs[1][1]
    assert [pieces.index(t) for t in ('<bt>', '<ft>')] == [
        vocab.token_id(t) for t in ('<bt>', '<ft>')
    ]
    for tag in ('<bt>', '<ft>'):
        batch = [[tag, *source.encode(line, out_type=str), '</s>'] for line in lines]
        hypotheses = ctranslate2_child.translate(out, batch, beam_size=1)
        # <ft>'s rows are copies of <unk>'s, so their scores tie exactly wherever <unk> is
        # the best: our search takes the first of tied ids (<unk>, dropped from our text),
        # CTranslate2 either, by its CPU's vector code (<ft> on an AMD EPYC host).
        tied = {'<unk>', '<ft>'}
        theirs = [target.decode([p for p in h if p not in tied]) for h in hypotheses]
        ours = run.translate(
            [f'{tag} {line}' for line in lines], beam_size=1, batch_size=DECODE_BATCH
        )
        assert ours == theirs, tag
    assert any(
        a != b
        for a, b in zip(
            ours, run.translate(lines, beam_size=1, batch_size=DECODE_BATCH), strict=True
        )
    )


def _marian_channels(row: np.ndarray) -> np.ndarray:
    from transformer.interop.marian_params import marian_channel_order

    return row[marian_channel_order(row.shape[-1])]


def test_add_tokens_needs_init_from_and_a_new_name(hf_dir, folder, tmp_path):
    from transformer import schema
    from transformer.training import init_from

    config = _config(folder, 1, add_tokens='<bt>')
    with pytest.raises(schema.ConfigError, match=r'set train.init_from') as info:
        schema.parse(config)
    assert '\n' not in str(info.value)
    config = _config(folder, 1, init_from=hf_dir, add_tokens='<bt>,</s>')
    with pytest.raises(TrainingError, match=r"'</s>' is already a token") as info:
        train_and_evaluate(config, str(tmp_path / 'run'))
    assert '\n' not in str(info.value) and not (tmp_path / 'run').exists()
    merged, start = init_from.apply(
        schema.parse(_config(folder, 1, init_from=hf_dir, add_tokens=TAGS)), str(tmp_path)
    )
    assert merged.data.vocab_size == start.tokenizer.vocab_size + 2
    assert start.added == [('<bt>', None), ('<ft>', '<unk>')]


@pytest.fixture(scope='module')
def tc_dir(tmp_path_factory):
    from tests.marian_dir import TC

    return marian_dir(tmp_path_factory, **TC)  # tests/test_convert_tc.py's, built once


def test_the_tc_layout_puts_the_new_tokens_after_every_piece(tc_dir, tmp_path):
    """eos, unk and pad mid-vocabulary and last: the new tokens are still Marian's V, V+1 and
    ours V, V+1, and MarianTokenizer reads the run's vocabulary with them."""
    from transformer.interop.marian_vocab import MarianVocabulary

    out = tmp_path / 'run'
    assert convert_cli(f'--from_hf={tc_dir}', f'--workdir={out}', '--add_tokens=<bt>,<ft>') is None
    vocab = MarianVocabulary(rundir.path(str(out), rundir.VOCAB_DIR))
    size = vocab.vocab_size - 2
    for n, tag in enumerate(('<bt>', '<ft>')):
        assert vocab.token_id(tag) == vocab.marian_id(size + n) == size + n
    tokenizer = transformers.MarianTokenizer.from_pretrained(rundir.path(str(out), 'vocab'))
    line = '>>fra<< <ft> ' + synthetic_lines()[1][0]
    assert tokenizer(line).input_ids[:-1] == [vocab.marian_id(i) for i in vocab.encode(line)]
    assert vocab.encode(line)[1] == size + 1
