"""The evaluate command: decode a split, score it, write hypotheses and scores."""

import json

import pytest

from transformer import evaluate


@pytest.mark.slow
def test_evaluate_command_writes_hypotheses_and_scores(run_dir, tmp_path, capsys):
    """`python -m transformer.evaluate` decodes the test split with beam search, prints the
    scores (chrF++ among them) and writes one hypothesis per reference plus a JSON of them."""
    out = tmp_path / 'hyps.txt'
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli(
            [
                'evaluate',
                f'--workdir={run_dir}',
                '--beam_size=2',
                '--max_examples=7',
                f'--output={out}',
            ]
        )
    assert not exit_info.value.code
    lines = out.read_text().splitlines()
    assert len(lines) == 7
    scores = json.loads(out.with_suffix('.json').read_text())
    assert scores['num_sentences'] == 7 and scores['beam_size'] == 2 and scores['steps'] == [4]
    assert 0.0 <= scores['sacrebleu'] <= 100.0
    assert 0.0 <= scores['chrf++'] <= 100.0 and 'nw:2' in scores['chrf++_signature']
    printed = capsys.readouterr().out
    assert f'chrF {scores["chrf"]:.2f}  ' in printed
    assert f'chrF++ {scores["chrf++"]:.2f}  {scores["chrf++_signature"]}' in printed


@pytest.mark.slow
def test_evaluate_split_of_hostile_folder_data(run_dir, tmp_path, caplog):
    """`evaluate --split` on folder files with hostile lines (as in test_data_text) scores
    every line; a split whose files differ in line count names both files and counts."""
    import shutil

    from tests.data.test_data_text import HOSTILE

    run, folder = tmp_path / 'run', tmp_path / 'text'
    shutil.copytree(run_dir, run)
    folder.mkdir()
    long_line = b' '.join([b'ze bix pud'] * 40)
    (folder / 'hostile.en').write_bytes(HOSTILE + b'\n' + long_line)
    (folder / 'hostile.de').write_bytes(HOSTILE.replace(b'\r\n', b'\n') + b'\nlo\n')
    (folder / 'short.en').write_bytes(b'a\nb\n')
    (folder / 'short.de').write_bytes(b'a\n')
    config = json.loads((run / 'config.json').read_text())
    config['data'].update(dataset='folder', folder=str(folder))
    (run / 'config.json').write_text(json.dumps(config))
    out = tmp_path / 'hyps.txt'
    argv = ['evaluate', f'--workdir={run}', '--beam_size=1', f'--output={out}']
    argv += ['--max_examples=0', '--step=4']  # absl flags outlive a cli() call in one process
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli([*argv, '--split=hostile'])
    assert not exit_info.value.code
    assert len(out.read_text().split('\n')) == 8 + 1
    assert 'hostile.en line 4: invalid UTF-8' in caplog.text
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli([*argv, '--split=short'])
    message = str(exit_info.value.code)
    assert 'short.en has 2 lines but' in message and 'short.de has 1' in message


def _eval_sweep():
    """benchmarks/eval_sweep.py as a module."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
    import eval_sweep

    return eval_sweep


@pytest.mark.slow
def test_eval_sweep_scores_each_setting_on_validation_and_refuses_test(run_dir, capsys):
    """benchmarks/eval_sweep.py: one row per (average, beam, alpha), each the score evaluate
    gives for that setting; the test split cannot be used to pick settings."""
    eval_sweep = _eval_sweep()
    args = ['--workdir', str(run_dir), '--average_last', '1', '2', '--beam_size', '1', '2']
    rows = eval_sweep.main([*args, '--max_examples', '6'])
    assert [(r['average_last'], r['beam_size']) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert rows[0]['steps'] == [4] and rows[2]['steps'] == [2, 4]
    assert {r['split'] for r in rows} == {'validation'}
    direct = evaluate.run(
        str(run_dir),
        average_last=2,
        split='validation',
        beam_size=2,
        max_examples=6,
        output=str(run_dir / 'direct.txt'),
    )
    assert rows[3]['tokenized_bleu'] == direct['tokenized_bleu']
    assert '| 2 (steps 2-4) | 2 | 0.6 | gnmt |' in capsys.readouterr().out
    # Hypotheses are kept under the last step averaged, so a sweep up to an earlier step
    # writes its own files and leaves the first sweep's as they were.
    sweep = run_dir / 'eval' / 'sweep'
    to_4 = sweep / 'validation-step4-avg2-beam1-alpha0.6-gnmt.txt'
    first = to_4.read_text()
    assert len(first.splitlines()) == 6
    earlier = eval_sweep.main(
        [*args[:2], '--step', '2', '--average_last', '2', '--beam_size', '1', '--max_examples', '6']
    )
    assert earlier[0]['steps'] == [2]
    assert (sweep / 'validation-step2-avg2-beam1-alpha0.6-gnmt.txt').is_file()
    assert to_4.read_text() == first
    with pytest.raises(SystemExit, match='No checkpoint for step 3 in .*; saved: \\[2, 4\\]'):
        eval_sweep.main([*args[:2], '--step', '3'])
    with pytest.raises(SystemExit, match='is the test split of this run'):
        eval_sweep.main(['--workdir', str(run_dir), '--split', 'test'])


@pytest.mark.slow
def test_evaluate_ensemble_of_runs(run_dir, tmp_path):
    """`evaluate --ensemble`: two copies of a run decode as the run alone (the mean of equal
    distributions); runs with another vocabulary or another model are refused in one line,
    while another dropout rate (training only) is accepted and decodes as the run alone.
    Everything decodes the validation split's first 6 sentences, as
    `test_eval_sweep_scores_each_setting_on_validation_and_refuses_test` does: the run alone
    and eval_sweep's ensemble run the programs compiled before them."""
    import shutil

    from sentencepiece import sentencepiece_model_pb2

    copy = tmp_path / 'copy'
    shutil.copytree(run_dir, copy)
    argv = ['evaluate', f'--workdir={run_dir}', '--beam_size=2', '--max_examples=6', '--step=4']
    argv.append('--split=validation')  # eval_sweep's split
    alone, together = tmp_path / 'alone.txt', tmp_path / 'together.txt'
    for out, extra in ((alone, []), (together, [f'--ensemble={copy}'])):
        with pytest.raises(SystemExit) as exit_info:
            evaluate.cli([*argv, f'--output={out}', *extra])
        assert not exit_info.value.code
    assert together.read_text() == alone.read_text()
    assert len(alone.read_text().splitlines()) == 6
    scores = json.loads(together.with_suffix('.json').read_text())
    assert scores['ensemble'] == [str(run_dir), str(copy)]
    assert scores['ensemble_steps'] == [[4], [4]]
    sweep = _eval_sweep().main(
        ['--workdir', str(run_dir), '--ensemble', str(copy), '--beam_size', '2']
        + ['--max_examples', '6']
    )
    assert sweep[0]['ensemble'] == [str(run_dir), str(copy)]
    assert (
        run_dir / 'eval' / 'sweep' / 'validation-step4-avg1-beam2-alpha0.6-gnmt-ensemble2.txt'
    ).is_file()

    config = json.loads((copy / 'config.json').read_text())
    config['model']['dropout_rate'] = 0.3
    (copy / 'config.json').write_text(json.dumps(config))
    # The search above again: its compiled program is reused, and the outputs must not move.
    evaluate.run(
        str(run_dir),
        step=4,
        split='validation',
        beam_size=2,
        max_examples=6,
        output=str(together),
        ensemble=[copy],
    )
    assert together.read_text() == alone.read_text()

    config['model']['layer_norm_epsilon'] = 1e-3
    (copy / 'config.json').write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli([*argv, f'--ensemble={copy}'])
    message = str(exit_info.value.code)
    assert message.startswith('error: ') and '\n' not in message
    assert f'{copy} has another model than {run_dir}' in message

    # The same number of pieces, one score changed: another vocabulary of the same size.
    config['model']['layer_norm_epsilon'] = json.loads((run_dir / 'config.json').read_text())[
        'model'
    ]['layer_norm_epsilon']
    (copy / 'config.json').write_text(json.dumps(config))
    vocab = copy / 'vocab' / 'spm.model'
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(vocab.read_bytes())
    proto.pieces[-1].score -= 1.0
    vocab.write_bytes(proto.SerializeToString())
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli([*argv, f'--ensemble={copy}'])
    assert f'{copy} has another vocabulary than {run_dir}' in str(exit_info.value.code)


@pytest.mark.slow
def test_default_outputs_of_a_grid_of_settings_keep_a_file_each(run_dir, tmp_path):
    """Without --output the file is named by beam, alpha and rule as well as split and steps,
    so two settings leave two files (each with its JSON); --output still names the file.
    On one device: the names do not depend on the layout, and its search compiles faster."""
    import jax

    one_device = jax.devices('cpu')[:1]
    eval_dir = run_dir / 'eval'
    for alpha, rule in ((0.6, 'gnmt'), (1.0, 'fairseq')):
        scores = evaluate.run(
            str(run_dir),
            step=4,
            beam_size=1,
            alpha=alpha,
            length_penalty=rule,
            max_examples=2,
            devices=one_device,
        )
        stem = f'test-4-beam1-alpha{alpha}-{rule}'
        written = json.loads((eval_dir / f'{stem}.json').read_text())
        assert written == json.loads(json.dumps(scores))
        assert len((eval_dir / f'{stem}.txt').read_text().splitlines()) == 2
    out = tmp_path / 'named.txt'
    evaluate.run(
        str(run_dir),
        step=4,
        beam_size=1,
        alpha=1.4,
        max_examples=2,
        output=str(out),
        devices=one_device,
    )
    assert out.is_file() and out.with_suffix('.json').is_file()
    assert not list(eval_dir.glob('*alpha1.4*'))
