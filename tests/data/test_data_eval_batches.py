"""Evaluation batches: every example, bucketed, and back in the split's order."""

import pytest

from tests.tiny_run import data_config
from transformer import data


def _config(**overrides):
    return data_config(**{'max_len': 32, **overrides})


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
    return data.get_tokenizer(_config(), str(tmp_path_factory.mktemp('vocab') / 'spm.model'))


def test_bucket_length():
    assert [data.bucket_length(n) for n in (1, 16, 17, 32, 33, 48, 49, 65, 97, 129, 200)] == [
        16,
        16,
        32,
        32,
        48,
        48,
        64,
        96,
        128,
        192,
        256,
    ]


def test_eval_batches_keep_every_example_in_order(tokenizer):
    config = _config(max_len=8)  # eval ignores max_len: nothing is truncated
    batches = data.make_eval_batches(config, tokenizer, 'validation', batch_size=16)
    sources, targets = data.load_text(config, 'validation')
    assert len(batches) == 5  # 70 examples: 4 full batches and one with 10 filler rows
    lengths = set()
    for batch in batches:
        assert set(batch) == {'inputs', 'targets', 'index'}
        assert batch['inputs'].shape == batch['targets'].shape == (16, batch['inputs'].shape[1])
        lengths.add(batch['inputs'].shape[1])
        fillers = batch['index'] == -1
        assert (batch['targets'][fillers] == 0).all()
        assert (batch['inputs'][fillers, 0] == data.EOS_ID).all()
    assert lengths <= {16, 32, 48, 64}
    assert (batches[-1]['index'] == -1).sum() == 10
    # Per-row outputs come back in the split's order; here the outputs are the rows' texts.
    outputs = [[tokenizer.decode(row) for row in batch['targets']] for batch in batches]
    assert data.restore_order(batches, outputs) == targets
    outputs = [[tokenizer.decode(row) for row in batch['inputs']] for batch in batches]
    assert data.restore_order(batches, outputs) == sources
    for batch in batches:
        for row, i in zip(batch['inputs'], batch['index'], strict=True):
            if i >= 0:
                ids = row[row != 0]
                assert ids[-1] == data.EOS_ID and len(ids) == len(tokenizer.encode(sources[i])) + 1
    with pytest.raises(ValueError):
        data.restore_order(batches, outputs[:-1])


def test_eval_batches_max_examples(tokenizer):
    batches = data.make_eval_batches(_config(), tokenizer, 'test', batch_size=8, max_examples=20)
    assert sorted(i for b in batches for i in b['index'].tolist() if i >= 0) == list(range(20))
    assert len(data.restore_order(batches, [b['index'] for b in batches])) == 20


def test_eval_set_holds_batches_and_their_references(tokenizer):
    """An EvalSet's references are the raw targets of exactly the examples in its batches."""
    config = _config()
    eval_set = data.make_eval_set(config, tokenizer, 'test', batch_size=8, max_examples=13)
    _, targets = data.load_text(config, 'test')
    assert eval_set.references == targets[:13]
    texts = [[tokenizer.decode(row) for row in b['targets']] for b in eval_set.batches]
    assert data.restore_order(eval_set.batches, texts) == eval_set.references
