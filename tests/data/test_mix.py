"""data.mix: several training corpora, weighted (or by temperature) and tagged: the entries as
written, the shares' formula, the draws within tolerance, a tag as one id on its entry's
sources only, exact resume mid-mix, and bad entries in one line."""

import json

import numpy as np
import pytest

from tests.tiny_run import data_config
from transformer import data
from transformer.data import mix, mix_entries

MAX_LEN = 32


def _folder(path, pairs, offset):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / 'train.en', 'w') as s, open(path / 'train.de', 'w') as t:
        for i in range(pairs):
            s.write(f'source {offset + i} word {i % 7} .\n')
            t.write(f'Ziel {offset + i} Wort {i % 5} .\n')


@pytest.fixture(scope='module')
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp('mix')
    _folder(root / 'real', 300, 0)
    _folder(root / 'bt', 60, 1000)
    return root


def _config(corpora, spec, **overrides):
    config = data_config(max_len=MAX_LEN, dataset='folder', **overrides)
    config.folder = str(corpora / 'real')
    config.mix = spec.format(root=corpora)
    return config


@pytest.fixture(scope='module')
def vocab(corpora, tmp_path_factory):
    """A vocabulary of the real corpus holding the mix's tags as control pieces."""
    config = _config(corpora, 'real={root}/real,bt={root}/bt:<bt>', vocab_size=200)
    return data.get_tokenizer(config, str(tmp_path_factory.mktemp('vocab') / 'spm.model'))


def test_entries_are_read_from_the_right():
    entries = mix_entries.parse(
        'real=wmt14_translate/de-en:2, bt=/data/c:d/bt:0.5:<bt>,m=./x:>>de<<'
    )
    assert entries == [
        mix_entries.MixEntry('real', 'wmt14_translate/de-en', 2.0, None),
        mix_entries.MixEntry('bt', '/data/c:d/bt', 0.5, '<bt>'),
        mix_entries.MixEntry('m', './x', None, '>>de<<'),
    ]
    assert [e.is_folder for e in entries] == [False, True, True]
    pair = mix_entries.parse('x=/data/c:d:2:<bt>:de=deu_Latn->en=eng_Latn')[0]
    assert (pair.source, pair.weight, pair.tag) == ('/data/c:d', 2.0, '<bt>')
    assert pair.pair == mix_entries.EntryPair('deu_Latn', 'eng_Latn', 'de', 'en')
    assert mix_entries.parse('y=/d:__en__->__de__')[0].pair == mix_entries.EntryPair(
        '__en__', '__de__'
    )
    assert mix_entries.tags('a=/x:<bt>,b=/y:<bt>,c=/z:>>de<<') == ['<bt>', '>>de<<']


@pytest.mark.parametrize(
    ('spec', 'message'),
    [
        ('real', "data.mix entry 'real' is not of the form NAME=SOURCE[:WEIGHT][:TAG][:PAIR]."),
        ('a=/x:en->de->fr', "data.mix entry 'a=/x:en->de->fr': its PAIR 'en->de->fr' must be"),
        ('a=/x:de=deu_Latn->eng_Latn', "data.mix entry 'a=/x:de=deu_Latn->eng_Latn': its PAIR"),
        ('a b=/x', "data.mix entry 'a b=/x': its NAME must be"),
        ('a=/x:0', "data.mix entry 'a=/x:0': its WEIGHT must be a number > 0."),
        ('a=/x:-2:<bt>', "data.mix entry 'a=/x:-2:<bt>': its WEIGHT must be a number > 0."),
        ('a=/x,a=/y', "data.mix names 'a' twice"),
        ('a=/x:<b t>', "data.mix entry 'a=/x:<b t>': its TAG '<b t>' must be"),
        ('a=:2', "data.mix entry 'a=:2' names no SOURCE"),
    ],
)
def test_bad_entries_are_one_line(spec, message):
    with pytest.raises(data.DataError) as info:
        mix_entries.parse(spec)
    assert str(info.value).startswith(message) and '\n' not in str(info.value)


def test_shares_follow_the_weights_or_the_temperature():
    two = mix_entries.parse('a=/a,b=/b')
    assert mix_entries.shares(two, [100, 900], 1.0) == pytest.approx([0.1, 0.9])
    assert mix_entries.shares(two, [100, 900], 2.0) == pytest.approx([10 / 40, 30 / 40])
    assert mix_entries.shares(mix_entries.parse('a=/a:3,b=/b:1'), [100, 900], 5.0) == pytest.approx(
        [0.75, 0.25]
    )
    # A weight left out: its temperature share of all entries, then everything normalised.
    left_out = mix_entries.shares(mix_entries.parse('a=/a:0.5,b=/b'), [100, 900], 1.0)
    assert left_out == pytest.approx([0.5 / 1.4, 0.9 / 1.4])


def _pairs(iterator, batches):
    totals = {}
    for _ in range(batches):
        next(iterator)
        for name, count in iterator.last_pairs.items():
            totals[name] = totals.get(name, 0) + count
    return totals


def test_batches_draw_the_weights_within_tolerance(corpora, vocab):
    """Equal weights for 300 and 60 pairs: over 60 batches of 8 rows (~2,000 pairs, several
    mix epochs) each gives 50% +- 3% of the pairs; the small one is repeated to do so."""
    config = _config(corpora, 'real={root}/real:1,bt={root}/bt:1')
    iterator = data.make_train_iterator(config, vocab, batch_size=8, seed=0)
    totals = _pairs(iterator, 60)
    share = totals['bt'] / sum(totals.values())
    assert abs(share - 0.5) < 0.03, totals
    assert sum(totals.values()) > 5 * 60 and iterator.epoch >= 2


def test_a_tag_is_one_id_on_its_entrys_sources_only(corpora, vocab, tmp_path):
    tag_id = vocab.token_id('<bt>')
    assert tag_id is not None
    assert tag_id not in vocab.encode('source <bt> word .')  # its text does not give it
    config = _config(corpora, 'real={root}/real,bt={root}/bt:<bt>')
    parts = mix.training_corpora(config, vocab, str(tmp_path))
    real, bt = parts.parts
    starts = bt.source_offsets[:-1].astype(np.int64)
    assert (bt.source_ids[starts] == tag_id).all()
    assert np.count_nonzero(bt.source_ids == tag_id) == bt.num_examples
    assert tag_id not in real.source_ids and tag_id not in bt.target_ids
    untagged = data.tokenize_split(
        mix_entries.entry_config(config, mix_entries.parse(config.mix)[1]), vocab, 'train'
    )
    np.testing.assert_array_equal(bt.source_lengths, untagged.source_lengths + 1)


def test_resume_mid_mix_is_exact(corpora, vocab, tmp_path):
    config = _config(corpora, 'real={root}/real:1,bt={root}/bt:2:<bt>')
    kwargs = {'batch_size': 8, 'seed': 4, 'cache_dir': str(tmp_path)}
    first = data.make_train_iterator(config, vocab, **kwargs)
    for _ in range(23):  # into the second mix epoch
        next(first)
    state = json.loads(json.dumps(first.get_state()))
    expected = [next(first) for _ in range(10)]
    resumed = data.make_train_iterator(config, vocab, **kwargs)
    resumed.set_state(state)
    for a, b in zip(expected, [next(resumed) for _ in range(10)], strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_a_mix_entry_without_train_files_stops_in_one_line(corpora, tmp_path):
    (tmp_path / 'empty').mkdir()
    config = _config(corpora, 'real={root}/real,bt=' + str(tmp_path / 'empty'))
    with pytest.raises(data.DataError) as info:
        mix.check_files(config)
    assert str(info.value).startswith("data.mix entry 'bt': Missing file for split 'train'")


def test_new_vocabularies_hold_the_tags_as_control_pieces(vocab):
    assert vocab._sp.is_control(vocab.token_id('<bt>'))


def test_an_entry_with_no_pair_that_fits_stops_in_one_line(corpora, vocab, tmp_path):
    long = tmp_path / 'long'
    long.mkdir()
    (long / 'train.en').write_text(' '.join(['source word .'] * 30) + '\n')
    (long / 'train.de').write_text(' '.join(['Ziel Wort .'] * 30) + '\n')
    config = _config(corpora, 'real={root}/real,long=' + str(long))
    with pytest.raises(data.DataError, match="data.mix entry 'long' has no training pair that"):
        data.make_train_iterator(config, vocab, batch_size=8, seed=0)
