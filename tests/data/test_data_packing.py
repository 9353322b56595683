"""Packed training batches: exact reconstruction, determinism, resumption, sharding."""

import json
import pathlib
import time

import numpy as np
import pytest

from tests.tiny_run import data_config
from transformer import data
from transformer.data import packing, sources, tokenized

MAX_LEN = 32


def _config(**overrides):
    return data_config(**{'max_len': MAX_LEN, **overrides})


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp('workdir'))


@pytest.fixture(scope='module')
def tokenizer(workdir):
    return data.get_tokenizer(_config(), f'{workdir}/spm.model')


@pytest.fixture(scope='module')
def train_data(tokenizer):
    return data.tokenize_split(_config(), tokenizer, 'train')


def _iterator(train_data, **kwargs):
    kwargs = {'batch_size': 4, 'seed': 0, 'max_len': MAX_LEN, **kwargs}
    return data.TrainIterator(train_data, **kwargs)


def _segments(tokens, segmentation, positions):
    """{segment id: tokens} of one row, checking positions restart at 0 and count up."""
    out = {}
    for segment in np.unique(segmentation[segmentation > 0]):
        where = np.flatnonzero(segmentation == segment)
        assert np.array_equal(where, np.arange(where[0], where[-1] + 1)), 'segment not contiguous'
        assert np.array_equal(positions[where], np.arange(len(where)))
        out[int(segment)] = tokens[where]
    return out


def _rows_of_epoch(iterator):
    """Every batch of the iterator's first epoch (batch_size must be 1 row)."""
    batches = []
    while iterator.epoch == 0:
        batches.append(next(iterator))
    return batches


def test_pack_examples_fills_rows_within_capacity():
    rng = np.random.default_rng(0)
    source, target = rng.integers(1, 20, 500), rng.integers(1, 20, 500)
    for open_rows in (1, 8):
        members, starts = data.pack_examples(source, target, 32, open_rows)
        assert sorted(members.tolist()) == list(range(500))
        for r in range(len(starts) - 1):
            row = members[starts[r] : starts[r + 1]]
            assert source[row].sum() <= 32 and target[row].sum() <= 32
    greedy = len(data.pack_examples(source, target, 32, 1)[1])
    assert len(starts) < greedy  # first-fit over open rows wastes less than greedy packing


def test_packing_reconstructs_every_example_exactly(train_data):
    iterator = _iterator(train_data, batch_size=1)
    batches = _rows_of_epoch(iterator)
    seen = []
    for batch in batches:
        assert set(batch) == {
            'inputs',
            'targets',
            'inputs_segmentation',
            'targets_segmentation',
            'inputs_positions',
            'targets_positions',
        }
        for array in batch.values():
            assert array.dtype == np.int32 and array.shape == (1, MAX_LEN)
        inputs = _segments(
            batch['inputs'][0], batch['inputs_segmentation'][0], batch['inputs_positions'][0]
        )
        targets = _segments(
            batch['targets'][0], batch['targets_segmentation'][0], batch['targets_positions'][0]
        )
        assert list(inputs) == list(targets) == list(range(1, len(inputs) + 1))
        for key in ('inputs', 'targets'):
            padding = batch[f'{key}_segmentation'][0] == 0
            assert (batch[key][0][padding] == 0).all() and (batch[key][0][~padding] != 0).all()
        for segment in inputs:
            source, target = inputs[segment], targets[segment]
            # Each segment is one whole example, ending with EOS and holding no other EOS.
            assert source[-1] == target[-1] == data.EOS_ID
            assert (source[:-1] != data.EOS_ID).all() and (target[:-1] != data.EOS_ID).all()
            seen.append((tuple(source), tuple(target)))
    expected = [
        (tuple(train_data.source(i)), tuple(train_data.target(i)))
        for i in range(train_data.num_examples)
        if len(train_data.source(i)) <= MAX_LEN and len(train_data.target(i)) <= MAX_LEN
    ]
    assert sorted(seen) == sorted(expected)  # every usable example exactly once per epoch
    stats = iterator.stats()
    assert stats['num_examples'] == len(expected)
    assert stats['long_dropped'] == train_data.num_examples - len(expected) > 0
    assert stats['examples_per_row'] > 1.5 and stats['padding_fraction'] < 0.3


def test_same_seed_same_batches(train_data):
    a, b, c = _iterator(train_data), _iterator(train_data), _iterator(train_data, seed=1)
    for _ in range(5):
        x, y, z = next(a), next(b), next(c)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert not np.array_equal(x['inputs'], z['inputs'])


@pytest.mark.parametrize('chunk_size', [packing.CHUNK_SIZE, 50])
def test_restored_state_continues_identically(train_data, chunk_size):
    iterator = _iterator(train_data, batch_size=8, chunk_size=chunk_size)
    for step in range(60):  # crosses chunk and epoch boundaries
        if step in (3, 25, 41):
            state = json.loads(json.dumps(iterator.get_state()))
            expected = [next(iterator) for _ in range(6)]
            restored = _iterator(train_data, batch_size=8, chunk_size=chunk_size, seed=123)
            start = time.perf_counter()
            restored.set_state(state)
            assert time.perf_counter() - start < 1.0
            assert restored.epoch == state['epoch']
            for want in expected:
                got = next(restored)
                for key in want:
                    np.testing.assert_array_equal(got[key], want[key])
        next(iterator)
    assert iterator.epoch >= 2


def test_data_groups_get_disjoint_rows_of_the_global_batch(train_data):
    single = _iterator(train_data, batch_size=8)
    shards = [_iterator(train_data, batch_size=8, data_group=p, data_groups=4) for p in range(4)]
    for _ in range(5):
        whole = next(single)
        parts = [next(s) for s in shards]
        for key in whole:
            assert parts[0][key].shape == (2, MAX_LEN)
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
    with pytest.raises(ValueError):
        _iterator(train_data, batch_size=6, data_groups=4)


def test_long_examples_truncated(train_data):
    iterator = _iterator(train_data, batch_size=1, max_len=12, long_examples='truncate')
    stats = iterator.stats()
    assert stats['long_truncated'] > 0 and stats['long_dropped'] == 0
    for batch in _rows_of_epoch(iterator):
        for key in ('inputs', 'targets'):
            row, segmentation = batch[key][0], batch[f'{key}_segmentation'][0]
            ends = np.flatnonzero(np.diff(np.append(segmentation, 0)) != 0)
            assert (row[ends[segmentation[ends] > 0]] == data.EOS_ID).all()


def test_make_train_iterator_uses_the_token_store(tokenizer, workdir, monkeypatch):
    config = _config()
    cache_dir = f'{workdir}/data_cache'
    iterator = data.make_train_iterator(
        config, tokenizer, batch_size=4, seed=0, cache_dir=cache_dir
    )
    first = next(iterator)
    stores = list(pathlib.Path(workdir, 'data_cache').glob('*.store'))
    assert len(stores) == 1 and stores[0].name.startswith('synthetic-train-')
    tokenized.clear_memory_cache()

    def no_text(*args, **kwargs):
        raise AssertionError('the stored token ids must be reused')

    monkeypatch.setattr(sources, 'load_text', no_text)
    monkeypatch.setattr(sources, 'read_chunks', no_text)
    again = data.make_train_iterator(config, tokenizer, batch_size=4, seed=0, cache_dir=cache_dir)
    for key, value in next(again).items():
        np.testing.assert_array_equal(value, first[key])
    assert set(iterator.stats()) >= {'padding_fraction', 'examples_per_row'}


def test_a_position_from_another_dataset_says_what_changed(train_data):
    """A saved data position past this dataset's chunks or rows (the data or batch changed
    since the checkpoint) is one line that says what to do."""
    iterator = _iterator(train_data)
    for bad in ({'chunk': 10**6, 'row': 0}, {'chunk': 0, 'row': 10**6}):
        state = {**iterator.get_state(), **bad}
        with pytest.raises(ValueError) as info:
            _iterator(train_data).set_state(state)
        message = str(info.value)
        assert message.startswith(f'Data position {state} does not fit this dataset')
        assert message.endswith(
            "changed since the checkpoint; resume with the run's own config.json, or use a new "
            '--workdir.'
        )
