"""Hostile bytes become one clean line of text per input line, with warnings naming lines."""

from transformer.data import text

HOSTILE = (
    b'plain line\r\n'  # CRLF line end: not a change
    b'\r\n'  # empty
    b'   \t \n'  # whitespace only
    b'bad \xff\xfe utf-8\n'  # invalid UTF-8
    b'nul\x00 and bell\x07\n'  # control characters
    b'form\x0cfeed and \xe2\x80\xa8 U+2028\n'  # splitlines() would cut these in two
    b'no final newline'
)


def test_hostile_bytes_keep_one_line_each_and_warn_with_line_numbers(caplog):
    lines = text.decode_lines(HOSTILE, 'in.txt')
    assert lines == [
        'plain line',
        '',
        '   \t ',
        'bad \ufffd\ufffd utf-8',
        'nul  and bell ',
        'form feed and \u2028 U+2028',
        'no final newline',
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    assert warnings == [
        'in.txt line 4: invalid UTF-8 replaced with U+FFFD.',
        'in.txt line 5: control characters replaced with spaces.',
        'in.txt line 6: control characters replaced with spaces.',
    ]
    assert text.decode_lines(b'', 'empty') == []
    assert text.decode_lines(b'one\n', 'x') == text.decode_lines(b'one', 'x') == ['one']
