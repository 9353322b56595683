"""Fine-tuning a multilingual model on its language codes: a converted M2M100 directory (built
by transformers in tests/fairseq_models.py) fine-tuned on two directions from one
``data.mix`` starts from its weights and lays every pair out with its codes; a code the
vocabulary lacks, codes on a vocabulary without any and a multilingual start without a pair
stop in one line before anything is written."""

import functools
import json
import os

import jax
import numpy as np
import pytest

from tests.fairseq_dirs import lines
from tests.fairseq_models import TRAIN
from transformer import data, interop, schema
from transformer.checkpoint import load_model
from transformer.interop.fairseq_vocab import FairseqVocabulary
from transformer.training import steps, train_and_evaluate


def _config(init_from=None, **data_keys):
    from tests.tiny_run import tiny_run_config

    config = tiny_run_config(1)
    config.data.update(**data_keys)
    config.model.dropout_rate = 0.0  # the first step's loss is the converted model's
    config.train.update(label_smoothing=0.0, batch_size=8)
    if init_from is not None:
        config.train.init_from = init_from
        config.opt.update(schedule='constant', lr_scale=1e-3)
    return config


def _segments(batch):
    """(source ids, target ids) of every example of a packed batch."""
    found = []
    for row in range(batch['inputs'].shape[0]):
        for segment in np.unique(batch['targets_segmentation'][row]):
            if segment:
                side = {
                    key: batch[key][row][batch[f'{key}_segmentation'][row] == segment]
                    for key in ('inputs', 'targets')
                }
                found.append((side['inputs'].tolist(), side['targets'].tolist()))
    return found


@pytest.mark.slow  # a conversion's fixtures and one step of training
def test_two_directions_from_one_mix_start_from_the_converted_weights(
    fairseq_hf_dirs,
    fairseq_runs,
    lines_folder,
    tmp_path,
):
    """en->de and de->en entries over one English-German folder: the first step's NLL is the
    converted model's teacher-forced NLL of that batch (no dropout, no smoothing), the run
    keeps the directory's vocabulary and special ids, and the batch holds both directions,
    each source ``[src_code] X </s>`` of its own language's text and each label
    ``[tgt_code] Y </s>``, as the vocabulary's `pair` lays them out."""
    mix = f'ende={lines_folder}:1:__en__->__de__,deen={lines_folder}:1:de=__de__->en=__en__'
    config = _config(
        str(fairseq_hf_dirs / 'm2m100'),
        dataset='folder',
        folder=lines_folder,
        mix=mix,
        source_lang_code='en',
        target_lang_code='de',
    )
    seen, run = [], tmp_path / 'run'
    train_and_evaluate(config, str(run), on_step=lambda s, m: seen.append(m))
    recorded = json.loads((run / 'config.json').read_text())['data']
    assert (recorded['pad_id'], recorded['decoder_start_id']) == (1, 2)
    assert (recorded['source_lang_code'], recorded['target_lang_code']) == ('en', 'de')
    assert interop.held_vocabulary(str(run / 'vocab')).name == 'm2m100'
    _, _, model, params, _ = load_model(str(fairseq_runs / 'm2m100'), scan_layers=False)
    vocab = FairseqVocabulary(fairseq_hf_dirs / 'm2m100')
    # The run's first batch (its data section, one device), through the converted model.
    typed = schema.parse(schema.complete(config))
    batch = next(data.make_train_iterator(typed.data, vocab, batch_size=8, seed=0))
    # One program: eagerly, each operation compiles on its own.
    evaluate = functools.partial(steps.eval_step, model=model, label_smoothing=0.0)
    sums = jax.jit(evaluate)(params, batch)
    converted_nll = float(sums['nll']) / float(sums['tokens'])
    assert seen[0]['nll'] == pytest.approx(converted_nll, rel=1e-4)
    en, de = vocab.language_id('en'), vocab.language_id('de')
    pairs = lines(TRAIN)  # the folder's training pairs
    texts = {
        'en': {tuple(vocab.encode(s)) for s, _ in pairs},
        'de': {tuple(vocab.encode(t)) for _, t in pairs},
    }
    firsts = []
    for source, target in _segments(batch):
        firsts.append(target[0])
        source_lang, target_lang = ('en', 'de') if target[0] == de else ('de', 'en')
        assert source[0] == (en if source_lang == 'en' else de) and source[-1] == target[-1] == 2
        assert tuple(source[1:-1]) in texts[source_lang]
        assert tuple(target[1:-1]) in texts[target_lang]
    assert set(firsts) == {en, de}, firsts


def _refused(config, workdir, message):
    with pytest.raises(data.DataError) as info:
        train_and_evaluate(config, str(workdir))
    text = str(info.value)
    assert message in text and '\n' not in text, text
    assert not workdir.exists() or not os.listdir(workdir)
    return text


def test_a_code_the_vocabulary_lacks_stops_in_one_line(fairseq_hf_dirs, lines_folder, tmp_path):
    config = _config(
        str(fairseq_hf_dirs / 'm2m100'),
        dataset='folder',
        folder=lines_folder,
        source_lang_code='en',
    )
    config.data.target_lang_code = 'xx_Fake'
    text = _refused(config, tmp_path / 'run', "data.target_lang_code='xx_Fake' is not a lang")
    assert '100 language codes: __af__, __am__' in text


def test_a_multilingual_start_without_a_pair_stops_in_one_line(
    fairseq_hf_dirs, lines_folder, tmp_path
):
    config = _config(str(fairseq_hf_dirs / 'm2m100'), dataset='folder', folder=lines_folder)
    text = _refused(config, tmp_path / 'run', 'is multilingual (100 language codes: __af__')
    assert 'set data.source_lang_code and data.target_lang_code' in text


def test_codes_on_a_vocabulary_without_any_stop_in_one_line(lines_folder, tmp_path):
    """A new joint SentencePiece vocabulary has no codes: the run's pair and a mix entry's
    are refused."""
    config = _config(dataset='folder', folder=lines_folder, source_lang_code='eng_Latn')
    config.data.target_lang_code = 'deu_Latn'
    _refused(config, tmp_path / 'a', "data.source_lang_code='eng_Latn' names a language code")
    config = _config(
        dataset='folder', folder=lines_folder, mix=f'x={lines_folder}:eng_Latn->deu_Latn'
    )
    _refused(config, tmp_path / 'b', "data.mix entry 'x': source='eng_Latn' names a language")
