"""benchmarks/multi30k_sweep.py on CPU with tiny settings: two recipes trained side by side in
their own processes, each scored on validation, one table."""

import json
import sys
from pathlib import Path

import pytest

from tests.tiny_run import SMALL

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_recipes_train_side_by_side_and_are_scored_on_validation(tmp_path, capsys):
    sys.path.insert(0, str(REPO / 'benchmarks'))
    import multi30k_sweep

    settings = [f'--set={key}={value}' for key, value in SMALL.items()]
    settings += ['--set=train.num_steps=3', '--set=train.checkpoint_every=3']
    rows = multi30k_sweep.main(
        [f'--out={tmp_path}', '--recipe=a=configs/tiny.py']
        + ['--recipe=b=configs/tiny.py,--config.model.dropout_rate=0.0', *settings]
        + ['--beam_size', '1', '2', '--max_examples=4']
    )
    assert [(r['recipe'], r['beam_size']) for r in rows] == [('a', 1), ('a', 2), ('b', 1), ('b', 2)]
    assert all(r['updates'] == 3 and r['split'] == 'validation' for r in rows)
    assert all(0 <= r['sacrebleu'] <= 100 and r['train_s'] > 0 for r in rows)
    assert rows[2]['flags'][-1] == '--config.model.dropout_rate=0.0'
    saved = json.loads((tmp_path / 'sweep.json').read_text())['rows']
    assert saved == json.loads(json.dumps(rows))
    table = (tmp_path / 'sweep.md').read_text().splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith('| a | 3 |')
    with pytest.raises(SystemExit, match='no config file configs/nope.py'):
        multi30k_sweep.main([f'--out={tmp_path}', '--recipe=c=configs/nope.py'])
