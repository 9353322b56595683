"""benchmarks/data_pipeline.py end to end on the synthetic task (offline): every stage it
times runs and is reported (its figures are not results)."""

import json

from benchmarks import data_pipeline


def test_data_pipeline_reports_every_stage(tmp_path, capsys):
    out = tmp_path / 'data_pipeline.json'
    data_pipeline.main(
        ['--dataset=synthetic', '--vocab_size=300', '--max_len=32', '--batch_size=8']
        + ['--num_batches=5', f'--workdir={tmp_path / "work"}', f'--out={out}']
    )
    report = json.loads(out.read_text())
    seconds = [key for key in report if key.endswith('_s') and not key.endswith('per_s')]
    assert seconds == [
        'prepare_and_read_text_s',
        'read_text_s',
        'vocab_training_s',
        'get_tokenizer_s',
        'tokenize_s',
        'tokenize_and_cache_s',
        'load_cached_ids_s',
        'make_train_iterator_s',
        'pack_one_epoch_s',
        'restore_state_s',
    ]
    assert all(report[key] >= 0 for key in seconds)
    assert report['dataset'] == 'synthetic' and report['config']['max_len'] == 32
    assert report['vocab_size'] == 300 and report['train_pairs'] > 0
    assert report['train_tokens'] / report['tokenize_s'] == report['tokenize_tokens_per_s']
    assert set(report['throughput']) == {'batches_per_s', 'tokens_per_s', 'rows_per_s'}
    assert 0 <= report['packing']['padding_fraction'] < report['packing_greedy']['padding_fraction']
    assert list(report['padding_by_max_len']) == ['32', '64', '128', '256']
    for split in ('eval_validation', 'eval_test'):
        assert report[split]['examples'] > 0 and 0 <= report[split]['padding_fraction'] < 1
    assert {'cpu', 'jax', 'device'} <= set(report['machine'])
    assert capsys.readouterr().out.endswith(f'saved {out}\n')
