"""benchmarks/pilot_table.py: validation figures of runs side by side, from metrics.jsonl."""

import json

from benchmarks import pilot_table


def test_rows_pair_each_steps_loss_with_its_bleu_and_show_a_run_in_progress(tmp_path):
    done, running = tmp_path / 'pilot_tiny', tmp_path / 'pilot_tiny_rdrop'
    records = {
        done: [
            {'step': 500, 'split': 'train', 'loss': 5.0},
            {'step': 500, 'split': 'validation', 'loss': 4.98816, 'nll': 4.27867},
            {'step': 500, 'split': 'validation', 'sacrebleu': 4.1418, 'tokenized_bleu': 4.1786},
        ],
        running: [{'step': 250, 'split': 'train', 'loss': 6.05021, 'rdrop_kl': 0.25}],
    }
    for workdir, lines in records.items():
        workdir.mkdir()
        (workdir / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in lines))
    lines = pilot_table.table([str(done), str(running), str(tmp_path / 'not_started')])
    assert lines[2] == '| pilot_tiny | 500 | 4.9882 | 4.2787 | 4.14 | 4.18 |'
    assert lines[3] == (
        '| pilot_tiny_rdrop | 250 (training: loss 6.0502, R-Drop KL 0.2500) | | | | |'
    )
    assert len(lines) == 4


def test_a_console_log_gives_the_same_rows(tmp_path):
    log = tmp_path / 'pilot_tiny_rdrop.log'
    log.write_text(
        '02:14:49 step 450/1500  loss 6.3163  nll 6.3300  rdrop kl 0.2574  acc 0.002  lr 1e-4\n'
        '02:14:50 step 500/1500  loss 5.3163  nll 5.3300  rdrop kl 0.1574  acc 0.002  lr 1e-4\n'
        '02:14:50 step 500  validation loss 4.9882  nll 4.2787  perplexity 72.14  accuracy 0.3\n'
        '02:23:50 step 500  validation sacreBLEU 4.14  tokenized BLEU 4.18  chrF 25.55  (best)\n'
        '02:24:50 step 550/1500  loss 5.0000  nll 5.3300  rdrop kl 0.1000  acc 0.002  lr 1e-4\n'
    )
    lines = pilot_table.table([str(log)])
    assert lines[2:] == [
        '| pilot_tiny_rdrop | 500 | 4.9882 | 4.2787 | 4.14 | 4.18 |',
        '| pilot_tiny_rdrop | 550 (training: loss 5.0000, R-Drop KL 0.1000) | | | | |',
    ]
