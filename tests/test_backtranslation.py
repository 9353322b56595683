"""docs/backtranslation.md's three steps on a small folder corpus: a reverse-direction run,
sampled translations of target-side text into a folder corpus, and a run on data.mix of the
real pairs and the tagged synthetic ones."""

import json

import pytest

from tests.marian_dir import synthetic_lines
from tests.tiny_run import tiny_run_config
from transformer import data, rundir, translate
from transformer.commands import train as trainer


def _write(folder, split, pairs):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'{split}.en').write_text(''.join(s + '\n' for s, _ in pairs))
    (folder / f'{split}.de').write_text(''.join(t + '\n' for _, t in pairs))


def _config(folder, source, target, **data_fields):
    config = tiny_run_config(2)
    config.data.update(dataset='folder', source_lang=source, target_lang=target, **data_fields)
    config.data.folder = str(folder)
    return config


@pytest.mark.slow
def test_back_translation_end_to_end(tmp_path):
    lines = synthetic_lines(260)
    real, bt = tmp_path / 'real', tmp_path / 'bt'
    _write(real, 'train', lines[:200])
    _write(real, 'validation', lines[200:220])
    mono = [t for _, t in lines[220:]]
    (tmp_path / 'mono.de').write_text(''.join(t + '\n' for t in mono))

    reverse = tmp_path / 'de-en'
    trainer.train_and_evaluate(_config(real, 'de', 'en'), str(reverse))
    bt.mkdir()
    with pytest.raises(SystemExit) as info:
        translate.cli(
            ['translate', f'--workdir={reverse}', '--sampling', '--seed=1']
            + [f'--input={tmp_path / "mono.de"}', f'--output={bt / "train.en"}']
        )
    assert not info.value.code
    assert len((bt / 'train.en').read_text().splitlines()) == len(mono)
    (bt / 'train.de').write_text((tmp_path / 'mono.de').read_text())

    forward = tmp_path / 'en-de-bt'
    config = _config(real, 'en', 'de', mix=f'real={real},bt={bt}:2:<bt>')
    final = trainer.train_and_evaluate(config, str(forward))
    assert final['step'] == 2
    records = [json.loads(line) for line in open(forward / rundir.METRICS_FILE)]
    train = [r for r in records if r['split'] == 'train']
    assert train and all(r['pairs/real'] > 0 and r['pairs/bt'] > 0 for r in train)
    vocab = rundir.load_tokenizer(config, str(forward))
    assert vocab.token_id('<bt>') is not None
    stores = [p for p in (forward / 'data_cache').iterdir() if p.name.endswith('.store')]
    assert len(stores) == 2
    assert isinstance(vocab, data.Tokenizer)
