"""tokenizer_config.json and special_tokens_map.json as transformers 4.2x-5 write them: the
special tokens as strings, as saved AddedToken dicts, or registered in ``added_tokens_decoder``
at their ids. Every way reads with the same ids, ours and MarianTokenizer's; files that
disagree with vocab.json stop in one line."""

import json
import os
import shutil

import pytest
import transformers

from tests.marian_dir import LANGUAGE_TOKENS, TC, marian_dir, synthetic_lines
from transformer.data import DataError
from transformer.interop import marian
from transformer.interop.marian_vocab import MarianVocabulary

SPECIAL = {'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}
LINES = [
    *(s for s, _ in synthetic_lines()[:20]),
    f'{LANGUAGE_TOKENS[1]} ze BLAND 42 .',
    'ze </s> bland<unk> <pad> .',
]


def _added_token(content, **extra):
    return {
        **extra,
        'content': content,
        'lstrip': False,
        'normalized': True,
        'rstrip': False,
        'single_word': False,
    }


def _saved_by_transformers(directory):
    """The tokenizer written by this transformers' own save_pretrained (5.x: the special
    tokens registered in added_tokens_decoder at vocab.json's ids, no special_tokens_map)."""
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    for name in ('tokenizer_config.json', 'special_tokens_map.json'):
        os.remove(directory / name)
    tokenizer.save_pretrained(directory)
    assert 'added_tokens_decoder' in json.loads((directory / 'tokenizer_config.json').read_text())


def _added_token_dicts(directory):
    """transformers 4.2x's save: eos, unk and pad as AddedToken dicts with a '__type', and a
    special_tokens_map.json naming them as dicts (4.3x)."""
    config = json.loads((directory / 'tokenizer_config.json').read_text())
    config.update({k: _added_token(v, __type='AddedToken') for k, v in SPECIAL.items()})
    (directory / 'tokenizer_config.json').write_text(json.dumps(config))
    special_map = {k: _added_token(v) for k, v in SPECIAL.items()}
    (directory / 'special_tokens_map.json').write_text(json.dumps(special_map))


def _registered_by_hand(directory):
    """transformers 4.3x's save, written by hand: added_tokens_decoder with the three special
    pieces at vocab.json's ids, the tokens themselves as strings."""
    vocab = json.loads((directory / 'vocab.json').read_text())
    config = json.loads((directory / 'tokenizer_config.json').read_text())
    config['added_tokens_decoder'] = {
        str(vocab[v]): {**_added_token(v, special=True), 'normalized': False}
        for v in SPECIAL.values()
    }
    (directory / 'tokenizer_config.json').write_text(json.dumps(config))


VARIANTS = {
    'saved_by_transformers': _saved_by_transformers,
    'added_token_dicts': _added_token_dicts,
    'registered_by_hand': _registered_by_hand,
}


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    """The tc layout: its special pieces mid-vocabulary, where an id read wrong shows."""
    return marian_dir(tmp_path_factory, **TC)


def _copy(hf_dir, tmp_path, edit):
    copy = tmp_path / 'hf'
    shutil.copytree(hf_dir, copy)
    edit(copy)
    return copy


def _their_ids(directory):
    theirs = transformers.MarianTokenizer.from_pretrained(directory)
    return [theirs(line)['input_ids'] for line in LINES], [
        theirs(text_target=line)['input_ids'] for line in LINES
    ]


@pytest.mark.parametrize('variant', VARIANTS)
def test_every_way_of_saving_reads_with_the_same_ids(variant, hf_dir, tmp_path):
    copy = _copy(hf_dir, tmp_path, VARIANTS[variant])
    original, ours = MarianVocabulary(hf_dir), MarianVocabulary(copy)
    assert ours.marian_special_ids() == original.marian_special_ids()
    for side in ('source', 'target'):
        assert ours.encode_batch(LINES, side) == original.encode_batch(LINES, side)
    assert _their_ids(copy) == _their_ids(hf_dir)  # the variant means the same to transformers
    loaded = marian.load(copy, weights=False)
    assert loaded.languages == ('en', 'mul')
    assert loaded.tokenizer.encode_batch(LINES) == original.encode_batch(LINES)


def _pad_registered_elsewhere(directory):
    _registered_by_hand(directory)
    path = directory / 'tokenizer_config.json'
    config = json.loads(path.read_text())
    pad = json.loads((directory / 'vocab.json').read_text())['<pad>']
    config['added_tokens_decoder'][str(pad - 1)] = config['added_tokens_decoder'].pop(str(pad))
    path.write_text(json.dumps(config))


def _other_eos_in_the_map(directory):
    _added_token_dicts(directory)
    path = directory / 'special_tokens_map.json'
    path.write_text(json.dumps({**json.loads(path.read_text()), 'eos_token': _added_token('<e>')}))


@pytest.mark.parametrize(
    'edit, message',
    [
        (_pad_registered_elsewhere, "added_tokens_decoder puts '<pad>' at id"),
        (_other_eos_in_the_map, "special_tokens_map.json has eos_token='<e>'"),
    ],
)
def test_files_that_disagree_with_vocab_json_stop_in_one_line(hf_dir, tmp_path, edit, message):
    copy = _copy(hf_dir, tmp_path, edit)
    with pytest.raises(DataError) as info:
        MarianVocabulary(copy)
    assert message in str(info.value) and '\n' not in str(info.value), info.value
    with pytest.raises(marian.MarianError, match=message.split("'")[0]):
        marian.load(copy, weights=False)
