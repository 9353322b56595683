"""A MarianMT vocabulary: MarianTokenizer's ids in our order, its text back, bad directories."""

import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import transformers

from tests.marian_dir import LANGUAGE_TOKENS, TC, left_out_pieces, marian_dir, synthetic_lines
from transformer.data import EOS_ID, PAD_ID, UNK_ID, DataError
from transformer.interop.marian_vocab import MarianVocabulary

# Pieces vocab.json lacks (capitals and digits are no piece of either model), whitespace,
# a language code not at the start, text without a piece.
ODD_LINES = [
    'Ze BLAND robop 42 .',
    'ze  bland\trobop\n',
    'ze >>fra<< bland',
    '>>fra',
    ' >>fra<< ze',
    '',
    '   ',
    'ze ▁ bland',
    'ünïcödé ß ﬁ',
]


@pytest.fixture(scope='module', params=['classic', 'tc'])
def hf_dir(tmp_path_factory, request):
    """OPUS-MT's first generation's vocabulary layout, and its tc generation's."""
    if request.param == 'tc':
        return marian_dir(tmp_path_factory, **TC)
    return marian_dir(tmp_path_factory, multilingual=True)


@pytest.fixture(scope='module')
def theirs(hf_dir):
    return transformers.MarianTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope='module')
def vocab(hf_dir):
    return MarianVocabulary(hf_dir)


def _their_ids(theirs, vocab, text, side):
    """MarianTokenizer's ids of ``text`` in our order, without its EOS."""
    ids = theirs(text)['input_ids'] if side == 'source' else theirs(text_target=text)['input_ids']
    assert ids[-1] == theirs.eos_token_id
    return [vocab.our_id(i) for i in ids[:-1]]


def test_ids_are_marian_tokenizers(theirs, vocab, hf_dir):
    lines = synthetic_lines()
    unknown = {'source': 0, 'target': 0}
    for side, texts in (('source', [s for s, _ in lines]), ('target', [t for _, t in lines])):
        texts = texts + ODD_LINES
        ours = vocab.encode_batch(texts, side)
        for text, ids in zip(texts, ours, strict=True):
            assert ids == _their_ids(theirs, vocab, text, side), (side, text)
            assert ids == vocab.encode(text, side)
            assert EOS_ID not in ids and PAD_ID not in ids
            unknown[side] += ids.count(UNK_ID)
    assert unknown['source'] > 10 and unknown['target'] > 10  # the test can fail
    # Pieces SentencePiece gives that vocab.json lacks are among them, not only new letters.
    gone = left_out_pieces(hf_dir)
    assert len(gone) >= 3
    target_pieces = theirs.spm_target.encode([t for _, t in lines], out_type=str)
    assert gone & {p for pieces in target_pieces for p in pieces}


def test_language_codes(theirs, vocab):
    assert vocab.language_tokens() == list(LANGUAGE_TOKENS)  # in vocab.json's id order
    assert set(theirs.supported_language_codes) == set(LANGUAGE_TOKENS)
    assert [vocab.token_id(t) for t in LANGUAGE_TOKENS] == [
        vocab.our_id(theirs.convert_tokens_to_ids(t)) for t in LANGUAGE_TOKENS
    ]
    assert vocab.token_id('>>xyz<<') is None
    source = synthetic_lines(5)[-1][0]
    for text in (f'>>fra<< {source}', f'>>spa<<{source}', f'>>xyz<< {source}', '>>deu<<'):
        ids = vocab.encode(text)
        assert ids == _their_ids(theirs, vocab, text, 'source'), text
    assert vocab.encode(f'>>fra<< {source}') == [vocab.token_id('>>fra<<'), *vocab.encode(source)]
    assert vocab.encode(f'>>xyz<< {source}')[0] == UNK_ID


def test_special_token_strings_in_text_are_unknown(theirs, vocab):
    """The one difference from MarianTokenizer: it reads '</s>' and '<pad>' in the text as
    its eos and pad; an EOS or a padding id inside a sentence would cut it short or mask it."""
    text = 'ze </s> bland<unk>robop <pad> .'
    ids = vocab.encode(text)
    expected = _their_ids(theirs, vocab, text, 'source')
    assert expected.count(EOS_ID) == 1 and expected.count(PAD_ID) == 1
    assert ids == [UNK_ID if i in (EOS_ID, PAD_ID) else i for i in expected]


def test_decode_matches_marian_tokenizer(theirs, vocab):
    lines = synthetic_lines()
    exact = 0
    for text in [t for _, t in lines] + ODD_LINES:
        ids = vocab.encode(text, 'target')
        marian = [vocab.marian_id(i) for i in [*ids, EOS_ID]]
        expected = theirs.decode(marian, skip_special_tokens=True)  # source.spm (its default)
        assert theirs.decode(marian, skip_special_tokens=True, use_source_tokenizer=False) == (
            expected
        )
        assert vocab.decode(ids) == expected, text
        exact += vocab.decode(ids) == text
    assert exact > len(lines) // 2  # lines without unknown pieces come back whole
    ids = vocab.encode(lines[0][1], 'target')
    assert vocab.decode(np.array([*ids[:2], PAD_ID, *ids[2:], EOS_ID, *ids])) == vocab.decode(ids)
    assert vocab.decode([]) == '' and vocab.decode([EOS_ID, *ids]) == ''
    with_code = [vocab.token_id('>>fra<<'), *ids]
    assert vocab.decode(with_code) == theirs.decode(
        [vocab.marian_id(i) for i in with_code], skip_special_tokens=True
    )


def test_ids_pieces_and_rows(vocab, theirs):
    """Our ids: pad, eos and unk first, then Marian's other ids in their order; for the first
    generation's layout that is Marian's turned by one."""
    size = vocab.vocab_size
    assert size == len(theirs.encoder)
    assert [vocab.id_to_piece(i) for i in (PAD_ID, EOS_ID, UNK_ID)] == ['<pad>', '</s>', '<unk>']
    special = [theirs.pad_token_id, theirs.eos_token_id, theirs.unk_token_id]
    assert [vocab.marian_id(i) for i in (PAD_ID, EOS_ID, UNK_ID)] == special
    assert vocab.marian_special_ids() == dict(zip(('pad', 'eos', 'unk'), special, strict=True))
    others = [vocab.marian_id(i) for i in range(3, size)]
    assert others == sorted(set(range(size)) - set(special))
    if special == [size - 1, 0, 1]:  # the first generation
        assert [vocab.our_id(m) for m in range(size)] == [(m + 1) % size for m in range(size)]
    else:
        assert theirs.eos_token_id > 100 and theirs.unk_token_id > theirs.eos_token_id
    for piece, marian in theirs.encoder.items():
        assert vocab.token_id(piece) == vocab.our_id(marian)
        assert vocab.id_to_piece(vocab.our_id(marian)) == piece
        assert vocab.marian_id(vocab.our_id(marian)) == marian
    rows = np.arange(size * 2).reshape(size, 2)  # row m: Marian's id m
    ours = vocab.rows_to_ours(rows)
    assert [ours[vocab.our_id(m), 0] // 2 for m in range(size)] == list(range(size))
    np.testing.assert_array_equal(vocab.rows_to_marian(ours), rows)
    assert vocab.pretokenize == 'none' and vocab.pretokenizer.encode('A b', 'target') == 'A b'
    assert (vocab.source_lang, vocab.target_lang) == ('en', 'mul')


def _copy(hf_dir, tmp_path, *names):
    for name in names or ('source.spm', 'target.spm', 'vocab.json'):
        shutil.copyfile(os.path.join(hf_dir, name), tmp_path / name)
    return tmp_path


def _edit_vocab(directory, edit):
    path = directory / 'vocab.json'
    vocab = json.loads(path.read_text(encoding='utf-8'))
    value = edit(vocab)
    text = value if isinstance(value, str) else json.dumps(vocab if value is None else value)
    path.write_text(text, encoding='utf-8')


def test_fingerprint_follows_the_files(hf_dir, vocab, tmp_path):
    copy = _copy(hf_dir, tmp_path)
    assert MarianVocabulary(copy).fingerprint == vocab.fingerprint

    def swap(v):
        a, b = list(v)[5:7]
        v[a], v[b] = v[b], v[a]

    _edit_vocab(copy, swap)
    assert MarianVocabulary(copy).fingerprint != vocab.fingerprint


def _last(v):
    return next(reversed(v))


BAD_VOCABS = {
    'not JSON': (lambda v: '{"</s>": 0,', 'vocab.json is not JSON'),
    'a list': (lambda v: list(v), 'must be a JSON object of piece -> integer id'),
    'a string id': (lambda v: v.update({'▁ze': '3'}), 'must be a JSON object of piece'),
    'no eos': (lambda v: {p: i for p, i in v.items() if p != '</s>'}, "has no '</s>'"),
    'no unk': (lambda v: {p: i for p, i in v.items() if p != '<unk>'}, "has no '<unk>'"),
    'no pad': (lambda v: {p: i for p, i in v.items() if p != '<pad>'}, "no '<pad>'"),
    'duplicate id': (lambda v: v.update({'▁ze': v['</s>']}), r'gives the id \d+ to both'),
    'gap': (lambda v: v.update({_last(v): len(v) + 5}), r'ids outside 0\.\.'),
    'duplicate piece': (
        lambda v: json.dumps(v)[:-1] + ', "<unk>": 1}',
        "has the piece '<unk>' twice",
    ),
}


@pytest.mark.parametrize('case', BAD_VOCABS)
def test_bad_vocab_json(hf_dir, tmp_path, case):
    edit, message = BAD_VOCABS[case]
    copy = _copy(hf_dir, tmp_path)
    _edit_vocab(copy, edit)
    with pytest.raises(DataError, match=message) as error:
        MarianVocabulary(copy)
    assert 'vocab.json' in str(error.value) and '\n' not in str(error.value)


def test_bad_files(hf_dir, tmp_path):
    def fails(directory, name, message):
        with pytest.raises(DataError, match=message) as error:
            MarianVocabulary(directory)
        assert os.path.join(str(directory), name) in str(error.value)
        assert '\n' not in str(error.value)

    for missing in ('source.spm', 'target.spm', 'vocab.json'):
        directory = tmp_path / f'without-{missing}'
        directory.mkdir()
        _copy(hf_dir, directory, *({'source.spm', 'target.spm', 'vocab.json'} - {missing}))
        fails(directory, missing, 'does not exist')
    copy = _copy(hf_dir, tmp_path)
    (copy / 'target.spm').write_bytes(b'')
    fails(copy, 'target.spm', 'is empty')
    (copy / 'target.spm').write_bytes(b'not a model')
    fails(copy, 'target.spm', 'not a SentencePiece model')
    _copy(hf_dir, copy, 'target.spm')
    config = copy / 'tokenizer_config.json'
    config.write_text(json.dumps({'separate_vocabs': True}))
    fails(copy, 'target_vocab.json', 'does not exist')  # separate_vocabs needs one
    config.write_text(json.dumps({'eos_token': {'content': '<eos>'}}))
    fails(copy, 'tokenizer_config.json', "eos_token='<eos>'")
    config.write_text(json.dumps({'source_lang': 'en', 'eos_token': {'content': '</s>'}}))
    assert MarianVocabulary(copy).source_lang == 'en'


def test_pretokenized_runs_are_refused(hf_dir):
    config = SimpleNamespace(pretokenize='moses')
    with pytest.raises(DataError, match='data.pretokenize=none'):
        MarianVocabulary(hf_dir, key='data.vocab_path', data_config=config)


def test_it_is_a_vocabulary_whose_special_ids_are_the_joint_ones(vocab, theirs):
    """The permutation puts Marian's pad, eos and unk on the joint ids, whatever the layout."""
    from transformer.data import JOINT, Vocabulary

    assert isinstance(vocab, Vocabulary) and vocab.special == JOINT
    assert vocab.marian_id(JOINT.pad) == theirs.pad_token_id
    assert vocab.marian_id(JOINT.eos) == theirs.eos_token_id
    assert vocab.marian_id(JOINT.unk) == theirs.unk_token_id
