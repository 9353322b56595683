"""benchmarks/fairseq_finetune.py: the stand-in's tokenizer files read by transformers'
`M2M100Tokenizer` and by ours with the same ids, its training pairs laid out both ways with
the codes, and the whole script at the tiniest sizes on the CPU (the scores are not results).
Needs the export extra (torch, transformers), as tests/test_export.py."""

import json

import pytest

from benchmarks import fairseq_finetune
from tests.marian_dir import synthetic_lines

_SKIP = "{} is not installed: pip install -e '.[export]'"
for _module in ('torch', 'transformers', 'sentencepiece', 'sacrebleu'):
    pytest.importorskip(_module, reason=_SKIP.format(_module))


def _data(path, count=40, test=5):
    path.mkdir()
    pairs = synthetic_lines(count + test)
    for lang, side in (('en', 0), ('de', 1)):
        lines = [p[side] for p in pairs]
        (path / f'train.{lang}').write_text('\n'.join(lines[:count]) + '\n')
        for split in ('val', 'test2016'):
            (path / f'{split}.{lang}').write_text('\n'.join(lines[count:]) + '\n')
    return pairs


def test_the_halves_and_the_pairs_both_ways_with_their_codes(tmp_path):
    """train's first lines halved, test2016 cut; the tokenizer files give M2M100Tokenizer's
    ids to ours; every training pair is ``__en__ X </s>`` -> ``__de__ Y </s>`` or back."""
    from transformer.interop.fairseq_vocab import FairseqVocabulary

    pairs = _data(tmp_path / 'data', count=41)
    splits = fairseq_finetune.write_folder(str(tmp_path / 'data'), tmp_path / 'folder', 41, 3)
    assert splits['train_a']['en'] == [p[0] for p in pairs[:20]]
    assert splits['train_b']['de'] == [p[1] for p in pairs[20:40]]
    assert len(splits['test2016']['en']) == len(splits['validation']['de']) == 3
    assert (tmp_path / 'folder' / 'train_b.de').read_text().splitlines() == splits['train_b']['de']
    hf = tmp_path / 'hf'
    hf.mkdir()
    half = splits['train_a']
    theirs = fairseq_finetune.write_tokenizer(hf, [*half['en'], *half['de']], 100)
    ours = FairseqVocabulary(hf)
    en, de = theirs.get_lang_id('en'), theirs.get_lang_id('de')
    assert (ours.language_id('en'), ours.language_id('de')) == (en, de)
    laid_out = fairseq_finetune.both_ways(theirs, half)
    assert len(laid_out) == 40
    for k, (source, labels) in enumerate(laid_out):
        codes, (src, tgt) = ((en, de), ('en', 'de')) if k < 20 else ((de, en), ('de', 'en'))
        assert (source[0], labels[0], source[-1], labels[-1]) == (*codes, 2, 2)
        assert source[1:-1] == ours.encode(half[src][k % 20])
        assert labels[1:-1] == ours.encode(half[tgt][k % 20])


def test_a_work_directory_in_use_stops_in_one_line(tmp_path):
    (tmp_path / 'work').mkdir()
    (tmp_path / 'work' / 'notes.txt').write_text('mine')
    with pytest.raises(SystemExit, match='is not empty: give a new --work') as info:
        fairseq_finetune.main([f'--work={tmp_path}/work', f'--data={tmp_path}'])
    assert '\n' not in str(info.value)
    assert [p.name for p in (tmp_path / 'work').iterdir()] == ['notes.txt']


@pytest.mark.long  # ~2.5 minutes: three jax commands compile, two training runs validate
def test_fairseq_finetune_scores_the_four_models(tmp_path, capsys):
    _data(tmp_path / 'data')
    out = tmp_path / 'fairseq_finetune.json'
    fairseq_finetune.main(
        [f'--data={tmp_path}/data', f'--work={tmp_path}/work', f'--out={out}']
        + ['--train_lines=40', '--sentences=5', '--spm_pieces=100', '--d_model=16']
        + ['--layers=1', '--heads=2', '--pretrain_steps=3', '--warmup=2', '--steps=2']
        + ['--set=train.batch_size=8', '--set=train.eval_every=2']
        + ['--set=train.checkpoint_every=2', '--set=opt.cooldown_steps=0']
        + ['--set=opt.warmup_steps=1']
    )
    report = json.loads(out.read_text())
    assert report['generate']['steps'] == 3
    for name in ('generate', 'converted', 'finetuned', 'scratch'):
        assert 0 <= report[name]['sacrebleu'] <= 100
        assert 0 <= report[name]['chrf_plus_plus'] <= 100
    for name in ('finetuned', 'scratch'):
        assert '--config.train.num_steps=2' in report[name]['train_command']
        summary = json.loads((tmp_path / 'work' / name / 'final_metrics.json').read_text())
        assert summary['step'] == 2, summary
    assert 'train.init_from=' in report['finetuned']['train_command']
    assert 'init_from' not in report['scratch']['train_command']
    assert '--target_lang de' in report['finetuned']['evaluate_command']
    for name in ('converted', 'finetuned', 'scratch'):
        lines = (tmp_path / 'work' / f'{name}.test2016.txt').read_text().splitlines()
        assert len(lines) == 5
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f'saved {out}'
