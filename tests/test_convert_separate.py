"""A MarianMT with separate source and target vocabularies (``separate_vocabs``: a
target_vocab.json, decoder_vocab_size != vocab_size, unshared embeddings) is refused in one
line naming the key, before anything is written: this model has one vocabulary of one size
(docs/pretrained.md)."""

import json
import shutil
from pathlib import Path

import pytest

from tests.marian_dir import marian_dir
from transformer import convert

_SKIP = "{} is not installed: pip install -e '.[export]'"
pytest.importorskip('torch', reason=_SKIP.format('torch'))
pytest.importorskip('transformers', reason=_SKIP.format('transformers'))


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory, separate_vocabs=True, train_steps=0)


def _convert(directory, out):
    with pytest.raises(SystemExit) as info:
        convert.cli(['convert', f'--from_hf={directory}', f'--workdir={out}'])
    return info.value.code


def test_the_fixture_has_two_vocabularies(hf_dir):
    config = json.loads((Path(hf_dir) / 'config.json').read_text())
    source = json.loads((Path(hf_dir) / 'vocab.json').read_text())
    target = json.loads((Path(hf_dir) / 'target_vocab.json').read_text())
    assert config['vocab_size'] == len(source) != config['decoder_vocab_size'] == len(target)
    assert config['share_encoder_decoder_embeddings'] is False
    tokenizer_config = json.loads((Path(hf_dir) / 'tokenizer_config.json').read_text())
    assert tokenizer_config['separate_vocabs'] is True


def _same_sizes(copy):
    """Two vocabularies of one size: the unshared embeddings are what is refused."""
    config = json.loads((copy / 'config.json').read_text())
    config['decoder_vocab_size'] = config['vocab_size']
    (copy / 'config.json').write_text(json.dumps(config))


def _joint_config(copy):
    """config.json of a joint vocabulary, tokenizer_config.json still separate."""
    _same_sizes(copy)
    config = json.loads((copy / 'config.json').read_text())
    config['share_encoder_decoder_embeddings'] = True
    (copy / 'config.json').write_text(json.dumps(config))


@pytest.mark.parametrize(
    'edit, message',
    [
        (None, 'decoder_vocab_size=127 differs from vocab_size=147'),
        (_same_sizes, 'share_encoder_decoder_embeddings=False is not expressible'),
        (_joint_config, 'separate_vocabs=True is not expressible'),
    ],
)
def test_separate_vocabularies_stop_in_one_line_naming_the_key(hf_dir, tmp_path, edit, message):
    copy = tmp_path / 'hf'
    shutil.copytree(hf_dir, copy)
    if edit:
        edit(copy)
    error = _convert(copy, tmp_path / 'run')
    assert error.startswith('error: ') and message in error and '\n' not in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf']  # nothing written
