"""Token ids past uint16 (a vocabulary of more than 65536 ids, as NLLB-200's 256206): the
in-memory token cache, its ``.npz`` file, the token store and packed training rows hold each
id exactly, in int32."""

import numpy as np
import pytest

from tests.wide_vocab import piece, wide_vocabulary
from transformer import data
from transformer.data import token_store, tokenized

SIZE = 70_500  # ids 0 .. 70499: past 65535 by more than the trained pieces
HIGH = (65_535, 65_536, 65_537, 70_123, SIZE - 1)  # each side of uint16's last id, the last


@pytest.fixture(scope='module')
def wide(tmp_path_factory):
    path = tmp_path_factory.mktemp('wide') / 'wide.model'
    return data.Tokenizer(str(wide_vocabulary(path, SIZE)))


def _pairs() -> tuple[list[str], list[str]]:
    """40 pairs, each naming some of the `HIGH` pieces between words of the synthetic pair."""
    sources, targets = [], []
    for i in range(40):
        first, second = HIGH[i % len(HIGH)], HIGH[(i + 2) % len(HIGH)]
        sources.append(f'ze {piece(first)} bix pud {piece(second)} .')
        targets.append(f'{piece(second)} ze pud' + ' bix' * (i % 3))
    return sources, targets


def _expected(wide, texts) -> list[list[int]]:
    return [wide.encode(t) + [wide.special.eos] for t in texts]


def _examples(ids, offsets) -> list[list[int]]:
    return [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def test_the_vocabulary_reads_the_high_pieces_as_their_ids(wide):
    assert wide.vocab_size == SIZE
    for i in HIGH:
        assert wide.encode(f'ze {piece(i)} pud')[1:].count(i) == 1
        assert wide.decode(wide.encode(f'{piece(i)}')) == piece(i)


def test_ids_past_uint16_round_trip_through_the_cache_and_the_store(wide, tmp_path):
    sources, targets = _pairs()
    ids, offsets = tokenized.encode_texts(wide, sources, 'source')
    assert ids.dtype == np.int32 and int(ids.max()) == SIZE - 1
    assert _examples(ids, offsets) == _expected(wide, sources)

    store = tmp_path / 'train.store'
    token_store.build(
        str(store), [(sources[:25], targets[:25]), (sources[25:], targets[25:])], wide
    )
    opened = data.open_store(str(store))
    for side, texts in (('source', sources), ('target', targets)):
        stored = getattr(opened, f'{side}_ids')
        assert stored.dtype == np.int32  # uint16 would wrap 65536 to 0
        assert _examples(stored, getattr(opened, f'{side}_offsets')) == _expected(wide, texts)

    # The .npz token cache of earlier versions, written, read back and turned into a store.
    split = tokenized.TokenizedSplit(ids, offsets, *tokenized.encode_texts(wide, targets, 'target'))
    cache = tmp_path / 'train.npz'
    tokenized._save(str(cache), split)
    loaded = tokenized.load_cache(str(cache), 'train')
    assert loaded.source_ids.dtype == np.int32
    np.testing.assert_array_equal(loaded.source_ids, ids)
    token_store.from_split(str(tmp_path / 'from-npz.store'), loaded)
    again = data.open_store(str(tmp_path / 'from-npz.store'))
    np.testing.assert_array_equal(again.target_ids, opened.target_ids)


def test_packed_rows_hold_the_high_ids_exactly(wide, tmp_path):
    """One epoch of packed rows from the store holds every example's ids, the high ones as
    they are, each example once."""
    sources, targets = _pairs()
    store = tmp_path / 'train.store'
    token_store.build(str(store), [(sources, targets)], wide)
    iterator = data.TrainIterator(data.open_store(str(store)), batch_size=1, seed=0, max_len=24)
    seen = []
    while iterator.epoch == 0:
        batch = next(iterator)
        assert batch['inputs'].dtype == batch['targets'].dtype == np.int32
        for segment in np.unique(batch['inputs_segmentation'][0]):
            if segment:
                source = batch['inputs'][0][batch['inputs_segmentation'][0] == segment]
                target = batch['targets'][0][batch['targets_segmentation'][0] == segment]
                seen.append((source.tolist(), target.tolist()))
    expected = list(zip(_expected(wide, sources), _expected(wide, targets), strict=True))
    assert sorted(seen) == sorted(expected)
    assert max(max(s) for s, _ in seen) == SIZE - 1
