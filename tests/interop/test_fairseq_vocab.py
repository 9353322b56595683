"""NLLB-200, M2M100 and mBART-50 vocabularies: transformers 5's ids and text on the same lines,
read from a SentencePiece model or from tokenizer.json alone; the model's rows past the
tokenizer's; tokens added and read back by transformers; bad directories in one line."""

import json
import shutil
from types import SimpleNamespace

import pytest

from tests.fairseq_dirs import CLASSES, LEFT_OUT, SPM_FILE, fairseq_dirs, lines
from transformer.data import DataError, Vocabulary
from transformer.interop.fairseq_vocab import (
    FAIRSEQ,
    FILLER,
    FairseqVocabulary,
    Prefixes,
    holds_vocabulary,
    load_vocabulary,
    tokenizer_files,
    write_vocabulary,
)

transformers = pytest.importorskip(
    'transformers', reason="transformers is not installed: pip install -e '.[export]'"
)

# (directory, source code, target code, a third code, how many codes, a new code)
FAMILIES = {
    'nllb': ('nllb', 'eng_Latn', 'deu_Latn', 'fra_Latn', 202, 'xyz_Latn'),
    'nllb_json': ('nllb_json', 'eng_Latn', 'deu_Latn', 'fra_Latn', 202, 'xyz_Latn'),
    'nllb_hub': ('nllb_hub', 'eng_Latn', 'deu_Latn', 'fra_Latn', 202, 'xyz_Latn'),
    'm2m100': ('m2m100', 'en', 'de', '__fr__', 100, '__xyz__'),
    'm2m100_bare': ('m2m100_bare', 'en', 'de', '__fr__', 100, '__xyz__'),
    'mbart50': ('mbart50', 'en_XX', 'de_DE', 'fr_XX', 52, 'xy_ZZ'),
    'mbart50_json': ('mbart50_json', 'en_XX', 'de_DE', 'fr_XX', 52, 'xy_ZZ'),
}
# Runs of spaces, spaces at the ends, characters the model never saw and NFKC's (ﬁ),
# special-token strings, an empty line; '{code}' is a language code in the middle of the text.
ODD_LINES = [
    '',
    '   ',
    'A man  in a   red shirt .',
    'a trailing space ',
    ' a leading space',
    'Ünïcödé ß ﬁ 42 ½ 漢字',
    'two words {code} in the middle',
    'glued{code}text',
    'ein </s> Hund <pad> läuft<unk> .',
    '<s> a <mask> and <mask>.',
]
PAIRS = lines(200)


def _kind(family):
    return FAMILIES[family][0].split('_')[0]


def _uncounted(family):
    """The codes transformers 5's tokenizer treats as text, not tokens: M2M100's where
    tokenizer_config.json does not list them (tests/fairseq_dirs.py)."""
    return FAMILIES[family][4] if family == 'm2m100_bare' else 0


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
    return fairseq_dirs(tmp_path_factory)


@pytest.fixture(scope='module', params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope='module')
def directory(dirs, family):
    return dirs / FAMILIES[family][0]


@pytest.fixture(scope='module')
def ours(directory):
    return FairseqVocabulary(directory)


@pytest.fixture(scope='module')
def theirs(directory, family):
    _, source, target, *_ = FAMILIES[family]
    cls = getattr(transformers, CLASSES[_kind(family)])
    return cls.from_pretrained(directory, src_lang=source, tgt_lang=target)


def _odd(family):
    code = FAMILIES[family][3]
    return [line.replace('{code}', code) for line in ODD_LINES]


def _our_view(ids):
    """Their ids of a pair's side as ours are: '</s>' and '<pad>' inside the text unknown."""
    inner = [FAIRSEQ.unk if i in (FAIRSEQ.pad, FAIRSEQ.eos) else i for i in ids[1:-1]]
    return [ids[0], *inner, ids[-1]]


def test_ids_are_transformers(family, ours, theirs):
    _, source_lang, target_lang, *_ = FAMILIES[family]
    sources = [s for s, _ in PAIRS] + _odd(family)
    targets = [t for _, t in PAIRS] + _odd(family)
    batch = theirs(sources, text_target=targets)
    unknown = 0
    for n, (source, target) in enumerate(zip(sources, targets, strict=True)):
        expected = (_our_view(batch['input_ids'][n]), _our_view(batch['labels'][n]))
        got = ours.pair(source, target, source_lang, target_lang)
        assert got == expected, (source, target)
        unknown += got[0].count(FAIRSEQ.unk)
    assert unknown >= 5  # unknown pieces and characters are among them: the test can fail
    assert ours.encode_batch(targets, 'target') == [ours.encode(t, 'target') for t in targets]
    code = ours.token_id(FAMILIES[family][3])
    # A code in the text is the code, where transformers 5 takes it as one.
    assert (code in ours.encode(_odd(family)[6])) == (not _uncounted(family))
    assert ours.encode('') == [] and ours.pair('', '', source_lang, target_lang)[0][-1] == 2


def test_decode_is_transformers(family, ours, theirs):
    targets = [t for _, t in PAIRS] + _odd(family)
    batch = theirs(targets, text_target=targets)
    whole = 0
    code = batch['labels'][0][0]
    for n, target in enumerate(targets):
        ids = ours.encode(target, 'target')
        labels = batch['labels'][n]
        if _uncounted(family):  # its decode keeps the code's text (fairseq_vocab.py)
            assert theirs.decode(labels, skip_special_tokens=True).startswith('__de__')
            labels = labels[1:]
        assert ours.decode(ids) == theirs.decode(labels, skip_special_tokens=True)
        assert ours.decode([code, *ids]) == ours.decode(ids)
        whole += ours.decode(ids) == target
    assert whole > len(PAIRS) // 2  # lines without unknown pieces come back whole
    ids = ours.encode(PAIRS[0][1], 'target')
    assert ours.decode([*ids, FAIRSEQ.eos, *ids]) == ours.decode(ids)
    assert ours.decode([FAIRSEQ.pad, *ids]) == ours.decode(ids)


def test_ids_codes_and_pieces(family, ours, theirs, dirs):
    """fairseq's four first, the pieces at SentencePiece's id + 1 (M2M100: vocab.json's ids),
    the codes in transformers' order, the size transformers gives."""
    import sentencepiece as spm

    *_, count, _ = FAMILIES[family]
    assert ours.vocab_size == ours.size == len(theirs) + _uncounted(family)
    assert [ours.id_to_piece(i) for i in range(4)] == ['<s>', '<pad>', '</s>', '<unk>']
    assert ours.special == FAIRSEQ and FAIRSEQ.decoder_start == FAIRSEQ.eos == 2
    assert isinstance(ours, Vocabulary) and ours.pretokenizer.encode('A  b', 'target') == 'A  b'
    codes = ours.language_tokens()
    assert len(codes) == count
    assert [theirs.convert_tokens_to_ids(c) for c in codes] == [ours.token_id(c) for c in codes]
    assert [ours.token_id(c) for c in codes] == sorted(ours.token_id(c) for c in codes)
    vocab = theirs.get_vocab()
    assert all(ours.token_id(piece) == i for piece, i in vocab.items())
    sp = spm.SentencePieceProcessor(model_file=str(dirs / 'nllb' / SPM_FILE))
    if _kind(family) == 'm2m100':
        assert all(ours.token_id(p) is None for p in LEFT_OUT)
    else:
        assert all(ours.id_to_piece(i + 1) == sp.id_to_piece(i) for i in range(3, len(sp)))
    assert ours.token_id('<mask>') == (None if _kind(family) == 'm2m100' else vocab['<mask>'])
    # transformers 5 puts <mask> before NLLB-200's codes read from tokenizer_config.json's
    # list, after them where added_tokens_decoder registers them so (the hub's files).
    first = min(ours.token_id(c) for c in codes)
    mask = {'nllb': first - 1, 'nllb_json': first - 1, 'nllb_hub': ours.size - 1}
    mask.update(mbart50=ours.size - 1, mbart50_json=ours.size - 1, m2m100=None, m2m100_bare=None)
    assert ours.token_id('<mask>') == mask[family]


def test_merges_are_transformers(dirs):
    """NLLB-200's BPE merges, generated as transformers 5 generates them (its own function)."""
    import sentencepiece as spm
    from transformers.tokenization_utils_base import generate_merges

    from transformer.interop.fairseq_backend import _merges

    sp = spm.SentencePieceProcessor(model_file=str(dirs / 'nllb' / SPM_FILE))
    pieces = [sp.id_to_piece(i) for i in range(len(sp))]
    merges = _merges(pieces)
    assert len(merges) > 100 and merges == generate_merges({p: i for i, p in enumerate(pieces)})


def test_tokenizer_json_alone_gives_the_same_ids(dirs):
    texts = [t for _, t in PAIRS[:50]] + _odd('nllb')
    for kind in ('nllb', 'mbart50'):
        spm_only, json_only = (
            FairseqVocabulary(dirs / kind),
            FairseqVocabulary(dirs / f'{kind}_json'),
        )
        assert not (dirs / f'{kind}_json' / SPM_FILE).exists()
        assert json_only.encode_batch(texts) == spm_only.encode_batch(texts)
        assert json_only.language_tokens() == spm_only.language_tokens()
        assert json_only.size == spm_only.size
        assert tokenizer_files(spm_only) == {SPM_FILE: str(dirs / kind / SPM_FILE)}
        assert tokenizer_files(json_only) == {}


def test_an_added_code_reads_back_in_transformers(family, ours, tmp_path):
    """A new code and a tag, written after the model's rows (3 past the tokenizer's here):
    transformers' tokenizer reads the written files with the same ids."""
    _, source, target, _, _, new = FAMILIES[family]
    rows = ours.size + 3
    grown = FairseqVocabulary(ours.directory, rows=rows)
    write_vocabulary(grown, [(new, None), ('<bt>', '<unk>')], str(tmp_path))
    back = load_vocabulary(str(tmp_path))
    cls = getattr(transformers, CLASSES[_kind(family)])
    theirs = cls.from_pretrained(tmp_path, src_lang=source, tgt_lang=target)
    assert [back.token_id(new), back.token_id('<bt>')] == [rows, rows + 1]
    assert [theirs.convert_tokens_to_ids(t) for t in (new, '<bt>')] == [rows, rows + 1]
    assert back.vocab_size == back.size == len(theirs) + _uncounted(family) == rows + 2
    assert (
        back.id_to_piece(ours.size) == FILLER.format(0) == theirs.convert_ids_to_tokens(ours.size)
    )
    assert all(back.token_id(ours.id_to_piece(i)) == i for i in range(ours.size))
    if _kind(family) != 'm2m100':
        assert back.language_tokens() == [*ours.language_tokens(), new]
    text = f'{PAIRS[0][0]} <bt> {new} {PAIRS[1][0]}'
    expected = theirs(text, text_target=text)
    got = back.pair(text, text, source, target)
    assert got == (expected['input_ids'], expected['labels'])
    assert back.fingerprint != ours.fingerprint and holds_vocabulary(str(tmp_path))
    assert not holds_vocabulary(str(tmp_path / 'none'))
    with pytest.raises(DataError, match=rf"'{new}' is already a token of the vocabulary"):
        write_vocabulary(back, [(new, None)], str(tmp_path / 'none'))


def test_rows_past_the_tokenizer(ours, tmp_path):
    grown = FairseqVocabulary(ours.directory, rows=ours.size + 2)
    assert grown.vocab_size == ours.size + 2 and grown.size == ours.size
    assert grown.fingerprint != ours.fingerprint
    assert grown.id_to_piece(ours.size + 1) == 'madeupword0001'
    ids = ours.encode(PAIRS[0][1])
    assert grown.decode([*ids, ours.size, ours.size + 1]) == ours.decode(ids)
    grown.copy_to(tmp_path)
    copy = load_vocabulary(str(tmp_path))
    assert copy.vocab_size == copy.size == ours.size + 2
    assert copy.encode_batch([t for _, t in PAIRS[:20]]) == ours.encode_batch(
        [t for _, t in PAIRS[:20]]
    )
    with pytest.raises(DataError, match=r'the model has \d+ embedding rows .* fewer than'):
        FairseqVocabulary(ours.directory, rows=ours.size - 1)
    banned = FairseqVocabulary(ours.directory, never_emit=(0, 5), rows=ours.size + 2)
    assert banned.special.never_emit == (0, 1, 5) and banned.special.pad == 1
    assert banned.decode([5, *ids]) == ours.decode(ids)
    with pytest.raises(DataError, match=r'never_emit=\(\d+,\) names ids past its'):
        FairseqVocabulary(ours.directory, never_emit=(ours.size,))


def test_codes_of_a_pair(ours, family):
    _, source, target, *_ = FAMILIES[family]
    prefixes = ours.prefixes(source, target)
    assert prefixes == Prefixes(
        source=(ours.language_id(source),), target=(ours.language_id(target),)
    )
    expected = [f'__{c}__' if _kind(family) == 'm2m100' else c for c in (source, target)]
    assert [ours.id_to_piece(i) for i in (*prefixes.source, *prefixes.target)] == expected
    with pytest.raises(
        DataError, match=r"source language='xx_YY' is not a language code .*codes: "
    ):
        ours.prefixes('xx_YY', target)


def _copy(dirs, kind, tmp_path):
    target = tmp_path / kind
    shutil.copytree(dirs / kind, target)
    return target


def _edit_json(path, edit):
    value = json.loads(path.read_text(encoding='utf-8'))
    edit(value)  # in place
    path.write_text(json.dumps(value), encoding='utf-8')


def test_bad_directories(dirs, tmp_path):
    with pytest.raises(DataError, match='names no tokenizer_class'):
        FairseqVocabulary(tmp_path)
    with pytest.raises(DataError, match=r'sentencepiece.bpe.model does not exist: an NLLB-200'):
        FairseqVocabulary(tmp_path, key='train.init_from', kind='nllb')
    m2m = _copy(dirs, 'm2m100', tmp_path)
    (m2m / SPM_FILE).unlink()
    with pytest.raises(DataError, match='vocab.json and sentencepiece.bpe.model'):
        FairseqVocabulary(m2m)
    nllb = _copy(dirs, 'nllb', tmp_path)
    _edit_json(nllb / 'tokenizer_config.json', lambda c: c.pop('extra_special_tokens'))
    with pytest.raises(DataError, match='lists no language codes'):
        FairseqVocabulary(nllb)
    with pytest.raises(DataError, match="'NllbTokenizer' is not an mBART-50 tokenizer"):
        FairseqVocabulary(dirs / 'nllb', kind='mbart50')
    with pytest.raises(DataError, match="reads raw text: set data.pretokenize=none, not 'moses'"):
        FairseqVocabulary(dirs / 'nllb', data_config=SimpleNamespace(pretokenize='moses'))
    legacy = _copy(dirs, 'nllb_hub', tmp_path)
    _edit_json(legacy / 'tokenizer_config.json', lambda c: c.update(legacy_behaviour=True))
    with pytest.raises(DataError, match=r'legacy_behaviour=true .* set it to false'):
        FairseqVocabulary(legacy)


def test_bad_m2m100_vocab_json(dirs, tmp_path):
    m2m = _copy(dirs, 'm2m100', tmp_path)

    def swap(vocab):
        vocab['<s>'], vocab['<unk>'] = vocab['<unk>'], vocab['<s>']

    _edit_json(m2m / 'vocab.json', swap)
    with pytest.raises(DataError, match=r"holds \['<unk>', '<pad>', '</s>', '<s>'\] at ids 0..3"):
        FairseqVocabulary(m2m)
    _edit_json(m2m / 'vocab.json', swap)
    _edit_json(m2m / 'vocab.json', lambda v: v.update({'extra': len(v) + 4}))
    with pytest.raises(DataError, match='has ids outside'):
        FairseqVocabulary(m2m)
    listed = _copy(dirs, 'm2m100', tmp_path / 'listed')
    add = lambda c: c['additional_special_tokens'].append('__xyz__')  # noqa: E731
    _edit_json(listed / 'tokenizer_config.json', add)
    with pytest.raises(DataError, match=r"lists the special tokens \['__xyz__'\], which are no"):
        FairseqVocabulary(listed)


def test_registered_ids_must_agree(dirs, tmp_path):
    nllb = _copy(dirs, 'nllb', tmp_path)
    size = FairseqVocabulary(dirs / 'nllb').size
    entry = {'content': '<bt>', 'special': True}
    _edit_json(
        nllb / 'tokenizer_config.json', lambda c: c.update(added_tokens_decoder={size + 5: entry})
    )
    with pytest.raises(
        DataError, match=f"puts '<bt>' at id {size + 5}, where transformers 5 gives"
    ):
        FairseqVocabulary(nllb)
