"""benchmarks/marian_speed.py end to end at the tiniest sizes on the CPU: a random MarianMT of
the synthetic language pair converted and decoded by ours, Hugging Face and CTranslate2, each
in a process of its own (the figures are not results). Needs the export extra (torch,
transformers, ctranslate2), as tests/test_export.py."""

import json

import pytest

from benchmarks import marian_speed
from tests.marian_dir import synthetic_lines

_SKIP = "{} is not installed: pip install -e '.[export]'"
for _module in ('torch', 'transformers', 'ctranslate2', 'sentencepiece'):
    pytest.importorskip(_module, reason=_SKIP.format(_module))

DECODES = ['decode_ours', 'decode_hf', 'decode_ct2']
MEASUREMENTS = ['build_hf_dir', 'convert_ours', 'decode_ours', 'convert_ct2', *DECODES[1:]]


def test_piece_count_spells_the_text_as_sentencepiece_decodes_it():
    pieces = {'▁Ein', '▁Hund', 'e', '▁fill00001', '▁'}
    count = lambda text: marian_speed.piece_count(text, pieces, 10)
    assert count('Ein Hund') == 2  # the first piece's '▁' dropped
    assert count('Ein▁fill00001 Hunde') == 4  # a piece SentencePiece lacks: as written
    assert count('▁fill00001 Hund') == 2  # ... also first
    assert count('e Hund') == 2 and count('') == 0
    assert count('Ein x') == 3  # '▁' and 'x', which no piece spells: one each


def test_a_rerun_removes_only_the_directories_it_made(tmp_path):
    """WORK/run and WORK/ct2 of a run before are removed when they hold this script's mark
    and nothing else; a run of the user's named run/ there (they were removed whatever they
    held), or a marked one holding a file of someone else's, stops the script in one line,
    nothing removed."""
    from tests.file_tree import tree_hashes

    work = tmp_path / 'work'
    (work / 'run' / 'checkpoints' / '4').mkdir(parents=True)
    (work / 'run' / 'config.json').write_text('{}')
    (work / 'ct2').mkdir()
    (work / 'ct2' / 'model.bin').write_bytes(b'weights')
    marian_speed.MARK.write(str(work / 'ct2'))
    before = tree_hashes(tmp_path)
    with pytest.raises(SystemExit, match=f'{work}/run is not what this script made there'):
        marian_speed.clear_previous(work)
    assert tree_hashes(tmp_path) == before
    marian_speed.MARK.write(str(work / 'run'))
    (work / 'ct2' / 'notes.txt').write_text('mine')
    with pytest.raises(SystemExit, match=f'{work}/ct2 is not what this script made there'):
        marian_speed.clear_previous(work)
    (work / 'ct2' / 'notes.txt').unlink()
    marian_speed.clear_previous(work)
    assert list(work.iterdir()) == []


@pytest.mark.long
def test_marian_speed_times_and_counts_the_three_systems(tmp_path, capsys):
    data = tmp_path / 'data'
    data.mkdir()
    pairs = synthetic_lines(120)
    for lang, side in (('en', 0), ('de', 1)):
        (data / f'train.{lang}').write_text('\n'.join(p[side] for p in pairs) + '\n')
        (data / f'test2016.{lang}').write_text('\n'.join(p[side] for p in pairs[:10]) + '\n')
    out = tmp_path / 'marian_speed.json'
    marian_speed.main(
        [f'--data={data}', f'--work={tmp_path}/work', '--d_model=16', '--layers=1']
        + ['--heads=2', '--vocab=400', '--sentences=6', '--batch_size=4', '--beam_size=2']
        + ['--threads=1', f'--out={out}']
    )
    report = json.loads(out.read_text())
    results = {r['measurement']: r for r in report['results']}
    assert list(results) == MEASUREMENTS
    assert results['build_hf_dir']['fillers'] > 0 and report['extra_length'] == 50
    versions = {'jax', 'torch', 'transformers', 'ctranslate2'}
    assert {'cpu', 'cpu_count', 'date', *versions} <= report.keys()
    for name in MEASUREMENTS:
        assert results[name]['command_s'] > 0 and results[name]['peak_rss_mib'] > 0
    for name in DECODES:
        result = results[name]
        assert result['hypotheses'] == 6
        assert 0 < result['text_pieces'] <= result['output_tokens'] <= result['limit_tokens']
        assert result['tokens_per_s'] > result['tokens_per_command_s'] > 0
    assert results['decode_ours']['run_wall_time_s'] < results['decode_ours']['command_s']
    for name in ('decode_hf', 'decode_ct2'):
        assert 0 < results[name]['decode_s'] < results[name]['command_s']
    # Two batches (4 + 2 sentences), each up to its longest input + 50: ours' limits are lower.
    assert results['decode_hf']['limit_tokens'] == results['decode_ct2']['limit_tokens']
    assert results['decode_ours']['limit_tokens'] < results['decode_hf']['limit_tokens']
    printed = capsys.readouterr().out.splitlines()
    assert [json.loads(line)['measurement'] for line in printed[:-1]] == MEASUREMENTS
    assert printed[-1] == f'saved {out}'


def test_the_tc_layout_puts_eos_and_unk_mid_vocabulary_and_pad_last():
    pieces = [f'▁p{i}' for i in range(50)]
    classic = marian_speed.entries(pieces, 100, 'classic')
    tc = marian_speed.entries(pieces, 100, 'tc')
    assert len(classic) == len(tc) == 100 and sorted(classic) == sorted(tc)
    assert classic[:2] == ['</s>', '<unk>'] and classic[-1] == '<pad>'
    assert (tc.index('</s>'), tc.index('<unk>'), tc.index('<pad>')) == (80, 95, 99)
    assert tc[:50] == pieces
    with pytest.raises(SystemExit, match='--vocab must be at least 53'):
        marian_speed.entries(pieces, 52, 'tc')
