"""configs/multi30k.py's candidate recipes are ``tiny`` with a regulariser, a key or two away."""

import pytest

from tests.configs.test_multi30k_fairseq import _flat


@pytest.mark.parametrize(
    'variant, keys',
    [
        ('tiny_rdrop', {'train.rdrop_alpha': 2.5}),
        ('tiny_worddrop', {'model.token_dropout_rate': 0.1, 'opt.weight_decay': 0.01}),
    ],
)
def test_a_candidate_changes_only_its_regularisers(variant, keys):
    tiny, candidate = _flat('tiny'), _flat(variant)
    assert {key: value for key, value in candidate.items() if tiny[key] != value} == keys
