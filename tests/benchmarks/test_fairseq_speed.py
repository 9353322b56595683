"""benchmarks/fairseq_speed.py: its NLLB-200-shaped tokenizer files read by transformers'
`NllbTokenizer` and by ours with the same ids, and the whole script at the tiniest sizes on
the CPU (a random model converted, decoded by ours, Hugging Face and CTranslate2, each in a
process of its own; the figures are not results). Needs the export extra (torch,
transformers, ctranslate2), as tests/test_export.py."""

import json

import pytest

from benchmarks import fairseq_speed
from tests.marian_dir import synthetic_lines

_SKIP = "{} is not installed: pip install -e '.[export]'"
for _module in ('torch', 'transformers', 'ctranslate2', 'sentencepiece'):
    pytest.importorskip(_module, reason=_SKIP.format(_module))

DECODES = ['decode_ours', 'decode_hf', 'decode_ct2']
MEASUREMENTS = ['build_hf_dir', 'convert_ours', 'decode_ours', 'export_ct2', *DECODES[1:]]


def _data(path, count=120, test=10):
    path.mkdir()
    pairs = synthetic_lines(count)
    for lang, side in (('en', 0), ('de', 1)):
        (path / f'train.{lang}').write_text('\n'.join(p[side] for p in pairs) + '\n')
        (path / f'test2016.{lang}').write_text('\n'.join(p[side] for p in pairs[:test]) + '\n')
    return pairs


def test_the_tokenizer_files_give_nllb_ids_with_fillers(tmp_path):
    """V - 2 ids (two rows short of the model's), the codes after the pieces and <mask> last,
    as NllbTokenizer and our vocabulary read them; text never encodes to a filler, and a
    filler decodes as its text."""
    import transformers

    from transformer.interop.fairseq_codes import NLLB_CODES
    from transformer.interop.fairseq_vocab import FairseqVocabulary

    pairs = synthetic_lines(60)
    texts = [t for pair in pairs for t in pair]
    pieces = 300 - fairseq_speed.EXTRA_ROWS - fairseq_speed.NOT_PIECES
    proto = fairseq_speed.spm_with_fillers(texts, 60, pieces)
    (tmp_path / fairseq_speed.SPM_FILE).write_bytes(proto)
    config = fairseq_speed.tokenizer_config(pieces)
    (tmp_path / 'tokenizer_config.json').write_text(json.dumps(config))
    theirs = transformers.NllbTokenizer.from_pretrained(tmp_path, src_lang='eng_Latn')
    ours = FairseqVocabulary(tmp_path)
    assert len(theirs) == ours.size == 298
    assert theirs.convert_tokens_to_ids(['eng_Latn', 'deu_Latn', '<mask>']) == [
        pieces + 1 + NLLB_CODES.index('eng_Latn'),
        pieces + 1 + NLLB_CODES.index('deu_Latn'),
        297,
    ]
    assert ours.language_id('deu_Latn') == theirs.convert_tokens_to_ids('deu_Latn')
    filler = theirs.convert_tokens_to_ids('▁fill000001')
    assert 60 < filler < theirs.convert_tokens_to_ids('▁fill000002') <= pieces
    assert theirs.decode([filler]) == 'fill000001'
    for line in texts[:20]:
        ids = theirs(line)['input_ids']
        assert ids == [theirs.convert_tokens_to_ids('eng_Latn'), *ours.encode(line), 2]
        assert max(ids[1:-1]) < filler
    with pytest.raises(SystemExit, match='--vocab must be at least') as info:
        fairseq_speed.spm_with_fillers(texts, 60, 10)
    assert '\n' not in str(info.value)


def test_a_rerun_removes_only_the_directories_it_made(tmp_path):
    work = tmp_path / 'work'
    (work / 'run').mkdir(parents=True)
    (work / 'run' / 'config.json').write_text('{}')
    with pytest.raises(SystemExit, match=f'{work}/run is not what this script made there'):
        fairseq_speed.measured.clear_previous(work, fairseq_speed.MADE, fairseq_speed.MARK)
    fairseq_speed.MARK.write(str(work / 'run'))
    fairseq_speed.measured.clear_previous(work, fairseq_speed.MADE, fairseq_speed.MARK)
    assert list(work.iterdir()) == []


@pytest.mark.long  # ~1 minute: six processes, one compiling a beam search
def test_fairseq_speed_times_and_counts_the_three_systems(tmp_path, capsys):
    _data(tmp_path / 'data')
    out = tmp_path / 'fairseq_speed.json'
    fairseq_speed.main(
        [f'--data={tmp_path}/data', f'--work={tmp_path}/work', '--d_model=16', '--layers=1']
        + ['--heads=2', '--vocab=300', '--spm_pieces=60', '--sentences=3', '--batch_size=2']
        + ['--beam_size=2', '--threads=1', f'--out={out}']
    )
    report = json.loads(out.read_text())
    results = {r['measurement']: r for r in report['results']}
    assert list(results) == MEASUREMENTS
    assert results['build_hf_dir']['spm_pieces'] == 300 - 206
    assert {'cpu', 'date', 'jax', 'torch', 'transformers', 'ctranslate2'} <= report.keys()
    for name in MEASUREMENTS:
        assert results[name]['command_s'] > 0 and results[name]['peak_rss_mib'] > 0
    for name in DECODES:
        result = results[name]
        assert result['hypotheses'] == 3
        assert 0 < result['text_pieces'] <= result['output_tokens'] <= result['limit_tokens']
        assert result['tokens_per_s'] > result['tokens_per_command_s'] > 0
    # Two batches (2 + 1 sentences), each up to its longest input + 50: ours' limits are lower.
    assert results['decode_hf']['limit_tokens'] == results['decode_ct2']['limit_tokens']
    assert results['decode_ours']['limit_tokens'] < results['decode_hf']['limit_tokens']
    printed = capsys.readouterr().out.splitlines()
    assert [json.loads(line)['measurement'] for line in printed[:-1]] == MEASUREMENTS
    assert printed[-1] == f'saved {out}'
