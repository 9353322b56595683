"""The translate command: one output line per input line, whatever the input."""

import pytest

from transformer import data as data_lib
from transformer import translate, workdir


def test_translate_keeps_blank_lines_and_survives_overlong_lines(run_dir, tmp_path):
    """`python -m transformer.translate`: one output line per input line, blank lines stay
    blank, an over-long line is cut (not crashed on), and a sentence translates the same
    alone as inside a batch."""
    sources, _ = data_lib.load_text(workdir.read_config(str(run_dir)).data, 'test')
    lines = [sources[0], '', '   ', ' '.join(sources[:30]), sources[1]]
    infile, outfile = tmp_path / 'in.txt', tmp_path / 'out.txt'
    infile.write_text('\n'.join(lines) + '\n')
    argv = ['translate', f'--workdir={run_dir}', f'--input={infile}', f'--output={outfile}']
    with pytest.raises(SystemExit) as exit_info:
        translate.cli([*argv, '--beam_size=2', '--max_input_tokens=24'])
    assert not exit_info.value.code
    out = outfile.read_text().split('\n')
    assert len(out) == len(lines) + 1 and out[-1] == ''  # one line each, newline-terminated
    assert out[1] == '' and out[2] == ''
    _, tokenizer, model, params, _ = workdir.load_model(str(run_dir))
    alone = translate.translate_lines(
        [sources[1]],
        tokenizer,
        model,
        params,
        beam_size=2,
        alpha=0.6,
        extra_length=50,
        batch_size=4,
        max_input_tokens=24,
    )
    assert alone == [out[4]]


def test_translate_survives_hostile_stdin(run_dir, monkeypatch, capsys, caplog):
    """Seven hostile lines on stdin (invalid UTF-8, NUL and other controls, CRLF, blank,
    whitespace-only, far longer than max_len, no final newline): exit 0, exactly one output
    line each, and a warning naming each line that was changed."""
    import io
    import sys

    from tests.test_data_text import HOSTILE

    sources, _ = data_lib.load_text(workdir.read_config(str(run_dir)).data, 'test')
    data = HOSTILE + b'\n' + ' '.join(sources[:40]).encode() + b'\r\nend'
    monkeypatch.setattr(sys, 'stdin', io.TextIOWrapper(io.BytesIO(data)))
    with pytest.raises(SystemExit) as exit_info:
        # absl flags outlive a cli() call in one process: reset what other tests set.
        translate.cli(
            ['translate', f'--workdir={run_dir}', '--beam_size=1', '--input=', '--output=']
            + ['--max_input_tokens=0', '--step=4']
        )
    assert not exit_info.value.code
    out = capsys.readouterr().out
    assert out.endswith('\n') and out.count('\n') == 9
    lines = out.split('\n')
    assert lines[1] == lines[2] == ''  # empty and whitespace-only lines stay empty
    warned = caplog.text
    for number in (4, 5, 6):
        assert f'stdin line {number}:' in warned
    assert 'Line 8 has' in warned  # the over-long line, cut to max_len tokens
