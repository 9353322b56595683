"""The joint SentencePiece vocabulary: ids, round trips, saving and reuse."""

import os

import pytest

from transformer import data, schema
from transformer.data import tokenizer as tokenizer_lib


def _config(**overrides):
    config = schema.default_config().data
    config.synthetic.num_train = 1000
    config.vocab_size = 500
    config.update(overrides)
    return config


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp('workdir'))


@pytest.fixture(scope='module')
def tokenizer(workdir):
    return data.get_tokenizer(_config(), os.path.join(workdir, 'spm.model'))


def test_special_ids_and_round_trip(tokenizer):
    assert tokenizer.id_to_piece(0) == '<pad>'
    assert tokenizer.id_to_piece(1) == '</s>'
    assert tokenizer.id_to_piece(2) == '<unk>'
    assert 200 < tokenizer.vocab_size <= 500
    sources, targets = data.load_text(_config(), 'validation')
    for text in sources[:50] + targets[:50]:
        ids = tokenizer.encode(text)
        assert ids and data.EOS_ID not in ids and data.PAD_ID not in ids
        assert tokenizer.decode(ids) == text
    # Decoding stops at the first EOS and skips padding.
    ids = tokenizer.encode(targets[0])
    assert tokenizer.decode([*ids[:2], 0, *ids[2:], 1, *ids, 0, 0]) == targets[0]
    assert tokenizer.decode([]) == ''
    assert tokenizer.encode('zzzzqqq')  # unseen characters map to unk, not to nothing


def test_saved_at_its_path_and_reused(tokenizer, workdir, monkeypatch):
    path = os.path.join(workdir, 'spm.model')
    assert tokenizer.model_path == path and os.path.isfile(path)

    def no_text(*args, **kwargs):
        raise AssertionError('a saved vocabulary must not be retrained')

    monkeypatch.setattr(tokenizer_lib, 'read_chunks', no_text)
    again = data.get_tokenizer(_config(), path)
    assert again.fingerprint == tokenizer.fingerprint
    given = data.get_tokenizer(_config(vocab_path=path), None)
    assert given.encode('ze') == tokenizer.encode('ze')


def test_missing_vocab_path_fails(tmp_path):
    with pytest.raises(data.DataError, match='does not exist'):
        data.get_tokenizer(_config(vocab_path=str(tmp_path / 'none.model')), None)


def test_training_is_deterministic(tokenizer, tmp_path):
    again = data.get_tokenizer(_config(), str(tmp_path / 'spm.model'))
    assert again.fingerprint == tokenizer.fingerprint


def test_sample_sentences():
    sources = [f's{i}' for i in range(100)]
    targets = [f't{i}' for i in range(100)]
    sample = tokenizer_lib.sample_sentences(sources, targets, 50, seed=0)
    assert len(sample) == len(set(sample)) == 50
    assert sample == tokenizer_lib.sample_sentences(sources, targets, 50, seed=0)
    assert any(s.startswith('s') for s in sample) and any(s.startswith('t') for s in sample)
    assert len(tokenizer_lib.sample_sentences(sources, targets, 1000)) == 200


def test_lowercasing_vocabulary(tmp_path):
    """'nmt_nfkc_cf' is stored in the model: every encode lowercases, German sharp s kept."""
    sentences = ['Ein Mann läuft über die Straße.', 'Zwei Hunde spielen im Schnee.'] * 50
    lower = tokenizer_lib.train_tokenizer(
        sentences, str(tmp_path / 'lc.model'), vocab_size=60, normalization='nmt_nfkc_cf'
    )
    cased = tokenizer_lib.train_tokenizer(sentences, str(tmp_path / 'cased.model'), vocab_size=60)
    text = 'Ein MANN läuft über die Straße.'
    assert lower.decode(lower.encode(text)) == 'ein mann läuft über die straße.'
    assert lower.encode(text) == lower.encode(text.lower())
    # The cased vocabulary never saw upper-case 'ANN'; it keeps the case of what it knows.
    assert cased.decode(cased.encode('Ein Mann')) == 'Ein Mann'
    assert cased.encode('Ein') != cased.encode('ein')
    # A reloaded model keeps its rule, whatever the config says later.
    assert tokenizer_lib.Tokenizer(lower.model_path).encode('ZWEI') == lower.encode('zwei')


def test_unknown_normalization_fails(tmp_path):
    config = _config(vocab_normalization='lowercase')
    with pytest.raises(data.DataError, match='vocab_normalization must be one of'):
        data.get_tokenizer(config, str(tmp_path / 'spm.model'))


def test_a_corrupt_vocabulary_file_is_one_line(tokenizer, tmp_path):
    """A truncated spm.model: a DataError naming the file (it was sentencepiece's traceback)."""
    broken = tmp_path / 'spm.model'
    broken.write_bytes(open(tokenizer.model_path, 'rb').read()[:100])
    with pytest.raises(data.DataError) as info:
        tokenizer_lib.Tokenizer(str(broken))
    message = str(info.value)
    assert message.startswith(f'{broken} is not a SentencePiece model that loads (')
    assert message.endswith('restore the file the run was trained with.') and '\n' not in message


def test_a_vocabulary_file_that_is_no_model_names_its_setting(tmp_path):
    """A data.vocab_path that is no SentencePiece model is the setting's fault (the message
    said to restore a run's file); an empty file is named as such (it loaded as a model with
    pad/eos/unk ids -1/-1/-1)."""
    not_a_model = tmp_path / 'v.model'
    not_a_model.write_text('hello\n')
    with pytest.raises(data.DataError) as info:
        data.get_tokenizer(_config(vocab_path=str(not_a_model)), None)
    message = str(info.value)
    assert message.startswith(f'data.vocab_path={not_a_model} is not a SentencePiece model ')
    assert message.endswith('; set data.vocab_path to a .model file written by SentencePiece.')
    empty = tmp_path / 'spm.model'
    empty.write_bytes(b'')
    with pytest.raises(data.DataError) as info:
        tokenizer_lib.Tokenizer(str(empty))
    assert str(info.value) == f'{empty} is empty; restore the file the run was trained with.'


def test_a_saved_vocabulary_larger_than_the_config_asks_is_one_line(tokenizer):
    """Resuming with a smaller data.vocab_size used to reuse the saved vocabulary silently
    (and write the smaller size into config.json)."""
    with pytest.raises(data.DataError) as info:
        data.get_tokenizer(_config(vocab_size=200), tokenizer.model_path)
    assert str(info.value) == (
        f'The vocabulary {tokenizer.model_path} has 500 pieces, more than data.vocab_size=200: '
        "it was trained with another data.vocab_size. Resume with the run's own, or use a new "
        '--workdir.'
    )
    assert data.get_tokenizer(_config(), tokenizer.model_path).vocab_size == 500
