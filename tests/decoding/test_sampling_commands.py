"""Sampling, prefixes and constraints through the translate and evaluate commands and
`api.Run.translate`: what they write, and the one-line errors before anything is decoded."""

import json
import os

import pytest

from transformer import api, evaluate, rundir, translate
from transformer import data as data_lib

SAMPLE = ['--sampling', '--temperature=1.2', '--top_k=20', '--top_p=0.9', '--seed=5']


def _translate(run_dir, tmp_path, capsys, *flags, lines=None):
    """(exit code, stderr, the output file's text or None) of the translate command."""
    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    infile, outfile = tmp_path / 'in.txt', tmp_path / 'out.txt'
    infile.write_text('\n'.join(lines or [sources[0], '', sources[1]]) + '\n')
    if outfile.exists():
        outfile.unlink()
    argv = ['translate', f'--workdir={run_dir}', f'--input={infile}', f'--output={outfile}']
    with pytest.raises(SystemExit) as info:
        translate.cli([*argv, '--step=4', *flags])
    out = outfile.read_text() if outfile.exists() else None
    return info.value.code, capsys.readouterr().err, out


@pytest.mark.slow
def test_translate_samples_are_nbest_rows_and_the_api_gives_the_same(run_dir, tmp_path, capsys):
    """--num_samples 3: three rows per non-blank line in sample order (rank = sample number),
    the same texts and log-probs as `api.Run.translate` with the same settings."""
    code, _, out = _translate(run_dir, tmp_path, capsys, *SAMPLE, '--num_samples=3')
    assert not code
    rows = [row.split('\t') for row in out.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [(i, k) for i in '02' for k in '123']
    run = api.load(str(run_dir), step=4)
    sources, _ = data_lib.load_text(run.config.data, 'test')
    settings = dict(sampling=True, temperature=1.2, top_k=20, top_p=0.9, seed=5)
    samples = run.translate([sources[0], '', sources[1]], num_samples=3, **settings)
    assert [h.text for line in samples for h in line] == [r[4] for r in rows]
    for line, found in zip((0, 2), (samples[0], samples[2]), strict=True):
        for h, row in zip(found, [r for r in rows if r[0] == str(line)], strict=True):
            assert abs(h.log_prob - float(row[3])) < 1e-3


@pytest.mark.parametrize(
    'flags, message',
    [
        (['--sampling', '--temperature=0'], '--temperature must be > 0, got 0.0.'),
        (['--sampling', '--temperature=-1'], '--temperature must be > 0'),
        (['--sampling', '--top_p=0'], '--top_p must be in (0, 1], got 0.0.'),
        (['--sampling', '--top_p=1.01'], '--top_p must be in (0, 1]'),
        (['--sampling', '--top_k=-2'], '--top_k must be >= 1'),
        (['--sampling', '--top_k=0'], '--top_k must be >= 1, got 0.'),
        (['--sampling', '--num_samples=0'], '--num_samples must be >= 1, got 0.'),
        (['--sampling', '--beam_size=4'], '--sampling draws outputs; it takes no --beam_size=4.'),
        (['--sampling', '--nbest=2'], '--nbest lists come from beam search'),
        (['--temperature=0.5'], '--temperature is a sampling setting: add --sampling.'),
        (['--min_length=-1'], '--min_length must be a whole number >= 0, got -1.'),
        (['--no_repeat_ngram=-2'], '--no_repeat_ngram must be a whole number >= 0'),
    ],
)
def test_bad_sampling_flags_are_one_line_and_write_nothing(
    run_dir, tmp_path, capsys, flags, message
):
    code, err, out = _translate(run_dir, tmp_path, capsys, *flags)
    assert code == 2 and out is None
    assert err.strip().splitlines() == [f'error: {message}'] or message in err.strip()
    assert len(err.strip().splitlines()) == 1


def test_bad_prefix_files_are_one_line_and_write_nothing(run_dir, tmp_path, capsys):
    prefix = tmp_path / 'prefix.txt'
    prefix.write_text('a\nb\n')  # 2 lines for 3
    code, err, out = _translate(run_dir, tmp_path, capsys, f'--prefix={prefix}')
    assert code == 2 and out is None
    assert (
        err.strip()
        == f'error: --prefix={prefix} has 2 lines and the input 3: give one prefix a line.'
    )
    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    prefix.write_text(f'x\n\n{" ".join(sources[:20])}\n')  # too long for line 3's output
    code, err, out = _translate(run_dir, tmp_path, capsys, f'--prefix={prefix}')
    assert out is None  # SystemExit's message: the one line, exit code 1
    assert code.startswith('error: The prefix of line 3 has ') and '\n' not in code


@pytest.mark.slow
def test_evaluate_names_a_sampled_output_by_its_settings(run_dir, capsys):
    """A sampled evaluation keeps its own file beside the beam one, and its JSON says how it
    was drawn; the same seed draws the same hypotheses again."""
    with pytest.raises(SystemExit) as info:
        evaluate.cli(
            ['evaluate', f'--workdir={run_dir}', '--step=4', '--max_examples=6', *SAMPLE,
             '--min_length=2', '--no_repeat_ngram=3', '--output=']
        )  # fmt: skip
    assert not info.value.code
    name = 'test-4-sample-t1.2-k20-p0.9-seed5-min2-ngram3'
    path = os.path.join(run_dir, 'eval', f'{name}.txt')
    scores = json.loads(open(os.path.join(run_dir, 'eval', f'{name}.json')).read())
    assert scores['sampling'] == dict(temperature=1.2, top_k=20, top_p=0.9, seed=5, num_samples=1)
    assert scores['constraints'] == dict(min_length=2, no_repeat_ngram=3)
    first = open(path).read()
    again = evaluate.run(
        str(run_dir), step=4, max_examples=6,
        sampling=api.decoding.Sampling(1.2, 20, 0.9, 5), constraints=api.decoding.Constraints(2, 3),
    )  # fmt: skip
    assert again['sacrebleu'] == scores['sacrebleu']
    assert open(path).read() == first
    assert 'hypotheses: ' + path in capsys.readouterr().out
