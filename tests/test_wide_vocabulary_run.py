"""A model whose vocabulary has more than 70000 ids (tests/wide_vocab.py: a SentencePiece model
of 70500 pieces, given as ``data.vocab_path``) trains from its token store, whose ids are
int32 and reach past 65535, and translates a line through the translate command."""

import json

import jax
import numpy as np
import pytest

from tests.tiny_run import tiny_run_config
from tests.wide_vocab import piece, wide_vocabulary
from transformer import data, rundir, translate
from transformer.commands import train as trainer

SIZE = 70_500
HIGH = (65_536, 68_000, SIZE - 1)  # the pieces the corpus names, all past uint16


def _write(folder, split, count):
    """``count`` pairs of words and high pieces: the target copies the source's pieces."""
    words = ('ze', 'bix', 'pud', 'mo')
    sources, targets = [], []
    for i in range(count):
        high = piece(HIGH[i % len(HIGH)])
        sources.append(f'{words[i % 4]} {high} {words[(i + 1) % 4]} .')
        targets.append(f'{high} {words[(i + 2) % 4]} .')
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'{split}.en').write_text(''.join(s + '\n' for s in sources))
    (folder / f'{split}.de').write_text(''.join(t + '\n' for t in targets))


@pytest.mark.slow
def test_a_vocabulary_of_70500_ids_trains_from_its_token_store_and_translates(tmp_path):
    vocab = wide_vocabulary(tmp_path / 'wide.model', SIZE)
    corpus = tmp_path / 'corpus'
    _write(corpus, 'train', 60)
    _write(corpus, 'validation', 8)
    config = tiny_run_config(2)
    config.data.update(dataset='folder', folder=str(corpus), vocab_path=str(vocab))
    config.data.vocab_size = SIZE
    config.model.update(d_model=16, num_heads=2, d_ff=32)
    run = tmp_path / 'run'
    # One device: its step compiles in less time than 8 devices' and moves the same ids.
    final = trainer.train_and_evaluate(config, str(run), devices=jax.devices('cpu')[:1])
    assert final['step'] == 2
    records = [json.loads(line) for line in open(run / rundir.METRICS_FILE)]
    assert [r['step'] for r in records if r['split'] == 'train'] == [1, 2]
    assert all(np.isfinite(r['loss']) for r in records if r['split'] == 'train')

    (store,) = [p for p in (run / 'data_cache').iterdir() if p.name.endswith('.store')]
    opened = data.open_store(str(store))
    assert opened.num_examples == 60
    for ids in (opened.source_ids, opened.target_ids):
        assert ids.dtype == np.int32 and set(HIGH) <= set(ids.tolist())

    source, out = tmp_path / 'in.txt', tmp_path / 'out.txt'
    source.write_text(f'ze {piece(SIZE - 1)} bix .\n')
    with pytest.raises(SystemExit) as info:
        translate.cli(
            ['translate', f'--workdir={run}', f'--input={source}', f'--output={out}']
            + ['--beam_size=1']
        )
    assert not info.value.code
    (line,) = out.read_text().splitlines()  # an untrained model's words: one line of them
    tokenizer = rundir.load_tokenizer(config, str(run))
    assert tokenizer.vocab_size == SIZE
    assert all(i < SIZE for i in tokenizer.encode(line))
