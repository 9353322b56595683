"""T5's vocabulary: transformers 5's T5Tokenizer's ids on the same lines, from spiece.model and
from tokenizer.json alone, with a MADLAD-400 tag first through --source_tag's mechanism; its
sentinels' ids; its files copied into a run; bad directories in one line."""

import shutil
from types import SimpleNamespace

import pytest

from tests.shared_dirs import built_once
from tests.t5_dirs import PIECES, TAGS, build_vocab_dirs, lines
from transformer.data import DataError, Vocabulary, tag_sources
from transformer.interop.t5_vocab import T5Vocabulary, load_vocabulary, write_vocabulary

transformers = pytest.importorskip(
    'transformers', reason="transformers is not installed: pip install -e '.[export]'"
)
LINES = [
    *lines(60, seed=1),
    '',
    '   ',
    'A man  in a   red shirt .',
    ' a leading space',
    'ß ﬁ 42 漢字',
]


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
    return built_once(tmp_path_factory, 't5_vocab', build_vocab_dirs)


@pytest.fixture(scope='module')
def theirs(dirs):
    return transformers.T5Tokenizer.from_pretrained(str(dirs / 'spm'))


@pytest.mark.parametrize('files', ['spm', 'json'])
@pytest.mark.parametrize('tag', [None, *TAGS])
def test_ids_are_t5_tokenizers(dirs, theirs, files, tag):
    """Our ids, eos appended as the pipeline does, equal T5Tokenizer's; with --source_tag the
    tag's id first equals T5Tokenizer's of the line with the tag typed before it."""
    vocab = T5Vocabulary(dirs / files)
    assert isinstance(vocab, Vocabulary)
    tagged = tag_sources(vocab, tag)
    ours = [[*ids, 1] for ids in tagged.encode_batch(LINES, 'source')]
    text = LINES if tag is None else [f'{tag} {line}' for line in LINES]
    want = theirs(text).input_ids
    assert ours == want
    assert any(len(ids) > 5 for ids in ours)
    if tag is not None:
        assert {ids[0] for ids in ours} == {TAGS.index(tag) + 3}  # user-defined pieces 3, 4
        assert tagged.encode('der Hund', 'target') == vocab.encode('der Hund')  # source only


@pytest.mark.parametrize('files', ['spm', 'json'])
def test_special_ids_sentinels_and_decoding(dirs, theirs, files):
    vocab = T5Vocabulary(dirs / files)
    assert (vocab.special.pad, vocab.special.eos, vocab.special.unk) == (0, 1, 2)
    assert vocab.special.decoder_start == 0
    assert (vocab.size, vocab.vocab_size) == (PIECES, PIECES + 100) == (PIECES, len(theirs))
    for n in (0, 1, 57, 99):
        sentinel = f'<extra_id_{n}>'
        assert vocab.token_id(sentinel) == theirs.convert_tokens_to_ids(sentinel)
        assert vocab.id_to_piece(vocab.token_id(sentinel)) == sentinel
    assert vocab.token_id('<extra_id_100>') is None
    ids = vocab.encode(LINES[0])
    want = theirs.decode([*ids, PIECES + 99], skip_special_tokens=True)  # ours stop at eos
    assert vocab.decode([*ids, PIECES + 99, 1, 5]) == want == LINES[0]


def test_rows_past_the_sentinels_and_a_runs_copy(dirs, tmp_path):
    """T5 v1.1's model has rows past its ids (32128 for 32100): they have no text; a run's
    copy reads back with the run's vocab_size as its rows and the same fingerprint."""
    vocab = T5Vocabulary(dirs / 'spm', rows=PIECES + 108)
    assert vocab.vocab_size == PIECES + 108 and vocab.id_to_piece(PIECES + 105) == ''
    assert vocab.token_id('<extra_id_0>') == PIECES + 99
    write_vocabulary(vocab, [], str(tmp_path))
    assert T5Vocabulary.holds(tmp_path)
    copy = load_vocabulary(
        str(tmp_path), data_config=SimpleNamespace(vocab_size=PIECES + 108, pretokenize='none')
    )
    assert copy.fingerprint == vocab.fingerprint and copy.vocab_size == PIECES + 108
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path))('a cat').input_ids == [
        *vocab.encode('a cat'),
        1,
    ]
    with pytest.raises(DataError, match='takes no added tokens'):
        write_vocabulary(vocab, [('<bt>', None)], str(tmp_path / 'x'))


def test_bad_directories(dirs, tmp_path):
    with pytest.raises(DataError, match='neither spiece.model nor tokenizer.json'):
        T5Vocabulary(tmp_path)
    with pytest.raises(DataError, match='fewer than the 48 pieces'):
        T5Vocabulary(dirs / 'spm', rows=40)
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'spiece.model').write_bytes(b'not a model')
    with pytest.raises(DataError, match='does not load'):
        T5Vocabulary(broken)
    assert not T5Vocabulary.holds(tmp_path) and T5Vocabulary.holds(dirs / 'json')
    shutil.copy(dirs / 'json' / 'tokenizer.json', tmp_path / 'tokenizer.json')
    assert not T5Vocabulary.holds(tmp_path)  # no tokenizer_config.json naming T5Tokenizer
