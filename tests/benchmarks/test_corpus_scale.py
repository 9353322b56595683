"""benchmarks/corpus_scale.py: the corpus it builds, and (long tier) every stage end to end on
a tiny model; its figures are not results."""

import json

import pytest

from benchmarks import corpus_scale


def _multi30k(tmp_path):
    folder = tmp_path / 'multi30k'
    folder.mkdir()
    for lang in ('en', 'de'):
        (folder / f'train.{lang}').write_text(''.join(f'{lang} {i} .\n' for i in range(7)))
        (folder / f'val.{lang}').write_text(f'{lang} val .\n')
    return folder


def test_the_corpus_repeats_the_training_lines_to_n_pairs(tmp_path):
    corpus = tmp_path / 'corpus'
    corpus_scale.make_corpus(corpus, _multi30k(tmp_path), 17)
    for lang in ('en', 'de'):
        lines = (corpus / f'train.{lang}').read_text().splitlines()
        assert (
            len(lines) == 17
            and lines[7] == lines[0] == f'{lang} 0 .'
            and lines[16] == f'{lang} 2 .'
        )
        assert (corpus / f'validation.{lang}').read_text() == f'{lang} val .\n'


@pytest.mark.long
def test_every_stage_runs_on_a_tiny_model(tmp_path):
    out = tmp_path / 'report.json'
    corpus_scale.main(
        ['--pairs=300', '--config=configs/tiny.py', '--steps=1', '--batches=3']
        + [f'--multi30k={_multi30k(tmp_path)}', f'--scratch={tmp_path / "s"}', f'--out={out}']
    )
    sizes = json.loads(out.read_text())['sizes']['300']
    assert sizes['prepare']['peak_rss_mib'] > 0 and sizes['train']['seconds'] > 0
    assert sizes['batches_per_s'] > 0
