"""benchmarks/multi30k_pretokenize.py end to end on a few lines: raw Multi30k files and a
reference repository laid out as LividWo/Revisit-MMT's (BPE'd ``*.lc.norm.tok`` lines), as a
checkout and as a bare git directory. The reference lines are written by hand as Moses
tokenizes them (lowercased, XML-escaped), one of them deliberately other."""

import json
import subprocess

import pytest

from benchmarks import multi30k_pretokenize

RAW = {
    'en': ["A man's dog, running.", 'Two dogs & a cat play in the snow.'],
    'de': ['Ein Mann läuft schnell.', 'Zwei Hunde "spielen" im Schnee.'],
}
THEIRS = {  # BPE'd: "@@ " joins the pieces of a word
    'en': ['a man &apos;s dog , run@@ ning .', 'two dogs and a cat play in the snow .'],
    'de': ['ein ma@@ nn läuft schnell .', 'zwei hunde &quot; spielen &quot; im sch@@ nee .'],
}


def _git(*args):
    return subprocess.run(['git', *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def files(tmp_path):
    manual = tmp_path / 'multi30k'
    manual.mkdir()
    for stem in ('train', 'val', 'test2016'):
        for lang, lines in RAW.items():
            (manual / f'{stem}.{lang}').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    checkout = tmp_path / 'Revisit-MMT'
    (checkout / 'data' / 'multi30k-en-de').mkdir(parents=True)
    for lang, lines in THEIRS.items():
        path = checkout / 'data' / 'multi30k-en-de' / f'test.2016.{lang}'
        path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
    _git('init', '-q', str(checkout))
    _git('-C', str(checkout), 'add', '-A')
    identity = ['-c', 'user.name=test', '-c', 'user.email=test@example.com']
    _git('-C', str(checkout), *identity, 'commit', '-q', '-m', 'reference')
    _git('clone', '-q', '--bare', str(checkout), str(tmp_path / 'bare.git'))
    commit = _git('-C', str(checkout), 'rev-parse', 'HEAD').strip()
    return manual, checkout, tmp_path / 'bare.git', commit


def test_pretokenize_check_counts_matching_lines_from_a_checkout_and_a_bare_repo(
    files, tmp_path, capsys
):
    manual, checkout, bare, commit = files
    reports = []
    for reference in (checkout, bare):
        out = tmp_path / f'{reference.name}.json'
        multi30k_pretokenize.main(
            [f'--reference={reference}', f'--manual_dir={manual}', '--splits=test2016']
            + [f'--out={out}']
        )
        reports.append(json.loads(out.read_text()))
    assert reports[0] == reports[1]
    report = reports[0]
    assert report['reference'] == f'LividWo/Revisit-MMT@{commit}'
    assert list(report['splits']) == ['test2016']
    en, de = report['splits']['test2016']['en'], report['splits']['test2016']['de']
    assert (de['lines'], de['matching'], de['same_tokens'], de['rate']) == (2, 2, 2, 1.0)
    assert (en['lines'], en['matching'], en['same_tokens'], en['rate']) == (2, 1, 1, 0.5)
    assert en['mismatches'] == [
        {
            'line': 2,
            'ours': 'two dogs &amp; a cat play in the snow .',
            'theirs': 'two dogs and a cat play in the snow .',
        }
    ]
    assert en['lowercase_last_matching'] == 1 and de['lowercase_last_matching'] == 2
    printed = capsys.readouterr().out
    assert 'test2016 en: 1/2 lines match (50.000%), 1 with the same tokens' in printed
    assert '    theirs: two dogs and a cat play in the snow .' in printed
