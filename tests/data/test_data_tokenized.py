"""Token ids of a split and their disk cache: a cache that does not read back, or cannot be
written, costs a tokenizing pass, never the run."""

import os

import numpy as np
import pytest

from transformer import data, schema
from transformer.data import tokenized


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
    config = schema.default_config().data
    path = str(tmp_path_factory.mktemp('vocab') / 'spm.model')
    return data.get_tokenizer(config, path)


def _assert_same(a, b):
    for field in ('source_ids', 'source_offsets', 'target_ids', 'target_offsets'):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_a_truncated_cache_file_is_tokenized_again_and_rewritten(tokenizer, tmp_path, caplog):
    config = schema.default_config().data
    first = data.tokenize_split(config, tokenizer, 'validation', cache_dir=str(tmp_path))
    (cache,) = tmp_path.iterdir()
    cache.write_bytes(cache.read_bytes()[:300])
    tokenized.clear_memory_cache()
    again = data.tokenize_split(config, tokenizer, 'validation', cache_dir=str(tmp_path))
    _assert_same(first, again)
    assert any('does not read back' in r.getMessage() for r in caplog.records)
    with np.load(cache) as arrays:  # rewritten whole
        np.testing.assert_array_equal(arrays['target_ids'], first.target_ids)


def test_a_cache_that_cannot_be_written_is_a_warning(tokenizer, tmp_path, caplog):
    config = schema.default_config().data
    blocked = tmp_path / 'a_file'
    blocked.write_text('not a directory')
    tokenized.clear_memory_cache()
    split = data.tokenize_split(config, tokenizer, 'validation', cache_dir=str(blocked / 'cache'))
    assert split.num_examples == config.synthetic.num_validation
    assert any('Could not cache the token ids' in r.getMessage() for r in caplog.records)
    assert os.listdir(tmp_path) == ['a_file']
