"""A multilingual vocabulary's language codes on the training pairs (data/language_pair.py):
the in-memory split, the token cache and the token store all hold each pair as the
vocabulary's `pair` lays it out, their keys differ by pair, a mix entry's PAIR reads its own
languages' texts, and bad pairs stop in one line."""

import numpy as np
import pytest

from tests.fairseq_dirs import fairseq_dirs, lines
from tests.tiny_run import data_config
from transformer import data
from transformer.data import mix, tokenized
from transformer.interop.fairseq_vocab import FairseqVocabulary

PAIRS = 12
PAIR = ('eng_Latn', 'deu_Latn')


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
    return FairseqVocabulary(fairseq_dirs(tmp_path_factory) / 'nllb')


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp('pairs')
    (path / 'train.en').write_text(''.join(s + '\n' for s, _ in lines(PAIRS)))
    (path / 'train.de').write_text(''.join(t + '\n' for _, t in lines(PAIRS)))
    return path


def _config(folder, **overrides):
    config = data_config(dataset='folder', max_len=256, **overrides)
    config.folder = str(folder)
    return config


def _examples(split) -> list[tuple[list[int], list[int]]]:
    return [
        (split.source_ids[a:b].tolist(), split.target_ids[c:d].tolist())
        for a, b, c, d in zip(
            split.source_offsets[:-1],
            split.source_offsets[1:],
            split.target_offsets[:-1],
            split.target_offsets[1:],
            strict=True,
        )
    ]


def test_memory_cache_and_store_hold_the_vocabularys_pair(vocab, folder, tmp_path):
    config = _config(folder, source_lang_code=PAIR[0], target_lang_code=PAIR[1])
    wanted = [list(map(list, vocab.pair(s, t, *PAIR))) for s, t in lines(PAIRS)]
    assert wanted[0][0][0] == vocab.token_id('eng_Latn')
    assert wanted[0][1][0] == vocab.token_id('deu_Latn')
    paired = data.run_pair(config, vocab)
    tokenized.clear_memory_cache()
    memory = tokenized.tokenize_split(config, paired, 'train')
    tokenized.clear_memory_cache()
    cached = tokenized.tokenize_split(config, paired, 'train', str(tmp_path / 'cache'))
    tokenized.clear_memory_cache()
    reread = tokenized.tokenize_split(config, paired, 'train', str(tmp_path / 'cache'))
    store = mix.training_corpora(config, vocab, str(tmp_path / 'store')).parts[0]
    for split in (memory, cached, reread, store):
        assert [list(map(list, e)) for e in _examples(split)] == wanted
    # Another pair of the same text is another cache file and another store.
    other = _config(folder, source_lang_code=PAIR[0], target_lang_code='fra_Latn')
    flipped = data.run_pair(other, vocab)
    assert tokenized.cache_key(config, paired, 'train') != tokenized.cache_key(
        other, flipped, 'train'
    )
    second = mix.training_corpora(other, vocab, str(tmp_path / 'store')).parts[0]
    assert second.target_ids[0] == vocab.token_id('fra_Latn')
    assert len(list((tmp_path / 'store').iterdir())) == 2


def test_a_mix_entrys_pair_reads_its_own_languages(vocab, folder, tmp_path):
    """``de=deu_Latn->en=eng_Latn`` reads the German file as sources; an entry without a
    pair takes the run's."""
    spec = f'ende={folder},deen={folder}:de=deu_Latn->en=eng_Latn'
    config = _config(folder, mix=spec, source_lang_code=PAIR[0], target_lang_code=PAIR[1])
    ende, deen = mix.training_corpora(config, vocab, None).parts
    english, german = vocab.token_id('eng_Latn'), vocab.token_id('deu_Latn')
    eos = vocab.special.eos
    for (source, target), (s, t) in zip(_examples(deen), lines(PAIRS), strict=True):
        assert source == [german, *vocab.encode(t), eos]
        assert target == [english, *vocab.encode(s), eos]
    assert np.all(ende.source_ids[ende.source_offsets[:-1]] == english)


@pytest.mark.parametrize(
    ('overrides', 'message'),
    [
        (
            dict(source_lang_code='eng_Latn', target_lang_code='xyz_Latn'),
            "data.target_lang_code='xyz_Latn' is not a language code of this NLLB-200 "
            'vocabulary (202 language codes: ace_Arab, ace_Latn, acm_Arab, ...).',
        ),
        (dict(source_lang_code='eng_Latn'), 'needs data.target_lang_code too'),
        ({}, 'the vocabulary is multilingual (202 language codes: ace_Arab'),
        (
            dict(mix='a=/x:eng_Latn->zz', source_lang_code='eng_Latn', target_lang_code='fra_Latn'),
            "data.mix entry 'a': target='zz' is not a language code",
        ),
    ],
)
def test_bad_pairs_stop_in_one_line(vocab, folder, overrides, message):
    with pytest.raises(data.DataError) as info:
        data.check_mix_vocabulary(_config(folder, **overrides), vocab)
    assert message in str(info.value) and '\n' not in str(info.value), str(info.value)


def test_codes_on_a_bilingual_vocabulary_stop_in_one_line(folder, tmp_path):
    """A joint SentencePiece vocabulary has no codes: the run's pair and a mix entry's are
    refused, and without either it trains as it did (no id added)."""
    config = _config(folder, vocab_size=120)
    joint = data.get_tokenizer(config, str(tmp_path / 'spm.model'))
    assert not data.has_codes(joint) and data.run_pair(config, joint) is joint
    for overrides, message in (
        (
            dict(source_lang_code='eng_Latn', target_lang_code='deu_Latn'),
            "data.source_lang_code='eng_Latn' names a language code, but the vocabulary has "
            'none (a bilingual or joint SentencePiece vocabulary): remove it.',
        ),
        (
            dict(mix=f'a={folder},b={folder}:de=deu_Latn->en=eng_Latn'),
            "data.mix entry 'b': source='deu_Latn' names a language code",
        ),
    ):
        with pytest.raises(data.DataError) as info:
            data.check_mix_vocabulary(_config(folder, **overrides), joint)
        assert message in str(info.value) and '\n' not in str(info.value), str(info.value)
