"""transformer.convert on a MarianMT with separate source and target vocabularies
(``separate_vocabs``: a target_vocab.json of decoder_vocab_size pieces, unshared embeddings, the
output tied to the decoder's): the run computes what Hugging Face's own code computes on the
same directory, its export gives the directory back, and inconsistent directories stop in one
line naming the key, before anything is written."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.marian_dir import TRAINED_LINES, hf_log_probs, marian_dir, synthetic_lines
from transformer import api, convert, export
from transformer.checkpoint import load_model
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

PAIRS = synthetic_lines()
# Unknown pieces and characters, special-token strings in the text.
ODD = ['Ze BLAND 42 .', 'ze </s> bland<unk> <pad> .', '>>fra<< ze']
SOURCE_SIZE, TARGET_SIZE = 147, 127  # the fixture's vocab.json and target_vocab.json


def _cli(module, *args):
    with pytest.raises(SystemExit) as info:
        module.cli([module.__name__.rsplit('.', 1)[-1], *args])
    return info.value.code


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory, separate_vocabs=True)


@pytest.fixture(scope='module')
def run_dir(hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp('converted') / 'run'
    assert _cli(convert, f'--from_hf={hf_dir}', f'--workdir={out}') is None
    return str(out)


@pytest.fixture(scope='module')
def hf(hf_dir):
    model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope='module')
def loaded(run_dir):
    return load_model(run_dir)


def _ours_of(tokenizer, side):
    """Our id of each Marian id of ``side``."""
    return np.array([tokenizer.our_id(m, side) for m in range(tokenizer.sizes[side])])


def test_the_fixture_has_two_vocabularies(hf_dir):
    config = json.loads((Path(hf_dir) / 'config.json').read_text())
    source = json.loads((Path(hf_dir) / 'vocab.json').read_text())
    target = json.loads((Path(hf_dir) / 'target_vocab.json').read_text())
    assert config['vocab_size'] == len(source) == SOURCE_SIZE
    assert config['decoder_vocab_size'] == len(target) == TARGET_SIZE
    assert config['share_encoder_decoder_embeddings'] is False
    assert config['pad_token_id'] == target['<pad>'] != source['<pad>']
    tokenizer_config = json.loads((Path(hf_dir) / 'tokenizer_config.json').read_text())
    assert tokenizer_config['separate_vocabs'] is True


def test_the_run_records_unshared_tables_and_never_emits_the_padded_target_ids(run_dir):
    config = json.loads((Path(run_dir) / 'config.json').read_text())
    assert config['model']['share_embeddings'] == 'target'
    assert config['data']['vocab_size'] == SOURCE_SIZE
    never = [int(i) for i in config['data']['never_emit'].split(',')]
    assert never == [PAD_ID, *range(TARGET_SIZE, SOURCE_SIZE)]


def test_token_ids_equal_marian_tokenizers(loaded, hf):
    """Each side by its own vocabulary, on lines with unknown pieces and special-token strings:
    ours are MarianTokenizer's through that side's permutation (a '</s>' or '<pad>' written in
    the text is unknown here: transformer/interop/marian_vocab.py)."""
    _, tokenizer, *_ = loaded
    theirs = hf[1]
    target_pad = tokenizer.marian_id(PAD_ID, 'target')
    unknown = 0
    for source, target in [*PAIRS[:40], *((line, line) for line in ODD)]:
        for side, ids in (
            ('source', theirs(source)['input_ids']),
            ('target', theirs(text_target=target)['input_ids']),
        ):
            text = source if side == 'source' else target
            if side == 'target':  # '<pad>' in the text: MarianTokenizer gives the source's id
                ids = [target_pad if i == theirs.pad_token_id else i for i in ids]
            expected = [int(i) for i in _ours_of(tokenizer, side)[ids]]
            assert expected[-1] == EOS_ID
            expected = [UNK_ID if i in (EOS_ID, PAD_ID) else i for i in expected[:-1]]
            assert tokenizer.encode(text, side) == expected, (side, text)
            unknown += expected.count(UNK_ID)
    assert unknown > 10  # the lines hold unknown pieces
    # The sides differ: one piece has two ids, one per vocabulary.
    assert tokenizer.encode('ze', 'source') != tokenizer.encode('ze', 'target')


@pytest.mark.slow
def test_teacher_forced_log_probs_equal_marians(loaded, hf):
    """log P of every position of a padded batch, every target row: ours (float32, full
    precision) equal MarianMTModel's to 1e-4, and the padded target rows have probability 0.
    MarianTokenizer pads the labels with the source's pad id, which the target's table lacks:
    they are given the target's."""
    _, tokenizer, model, params, _ = loaded
    hf_model, theirs = hf
    pairs = PAIRS[:16]
    batch = theirs([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True)
    inputs, labels = np.array(batch['input_ids']), np.array(batch['labels'])
    target_pad = hf_model.config.pad_token_id
    labels[labels == theirs.pad_token_id] = target_pad
    batch['labels'] = labels
    assert (inputs == theirs.pad_token_id).any()
    expected = hf_log_probs(hf_model, batch)
    source, target = _ours_of(tokenizer, 'source'), _ours_of(tokenizer, 'target')
    with jax.default_matmul_precision('float32'):
        logits = jax.jit(model.apply)(  # one program: eagerly, each operation compiles
            {'params': params}, jnp.asarray(source[inputs]), jnp.asarray(target[labels])
        )
    log_probs = np.asarray(jax.nn.log_softmax(logits, -1))
    real = labels != target_pad
    assert np.exp(log_probs[..., TARGET_SIZE:]).max() == 0.0
    np.testing.assert_allclose(log_probs[..., target][real], expected[real], atol=1e-4, rtol=0)
    assert np.abs(expected[real]).max() > 1.0


def _hf_greedy_texts(tokenizer, out) -> list[str]:
    """generate's outputs (target ids) as our text: MarianTokenizer's decoding skips the
    source's pad id, not the target's, so its texts hold '<pad>'."""
    target = _ours_of(tokenizer, 'target')
    return [tokenizer.decode(target[row.numpy()]) for row in out]


@pytest.mark.slow
def test_greedy_outputs_equal_generates(run_dir, loaded, hf):
    """Greedy outputs equal generate(num_beams=1) with the directory's generation config (the
    target's pad never generated), token for token, on the learned lines."""
    hf_model, theirs = hf
    lines = [s for s, _ in PAIRS[:TRAINED_LINES]]
    batch = theirs(lines, padding=True, return_tensors='pt')
    with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=1)
    expected = _hf_greedy_texts(loaded[1], out)
    assert len(set(expected)) > len(lines) // 2  # distinct outputs, not one repeated
    # One device and one batch of every line: one search compiled, and one device's programs
    # compile faster than the 8 host devices' (tests/compiles.py).
    run = api.load(run_dir, devices=jax.devices()[:1])
    assert run.translate(lines, beam_size=1, batch_size=len(lines)) == expected


@pytest.mark.slow
def test_export_gives_back_the_directory(run_dir, hf_dir, tmp_path):
    """Round trip: every tensor equal (each side's table back in Marian's order, the padded rows
    dropped), the tokenizer files byte for byte (target_vocab.json included), config.json's
    and generation_config.json's values."""
    from safetensors.numpy import load_file

    out = tmp_path / 'hf'
    assert _cli(export, f'--workdir={run_dir}', f'--out={out}') is None
    original, exported = (load_file(str(Path(d) / 'model.safetensors')) for d in (hf_dir, out))
    assert sorted(original) == sorted(exported)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    names = ('vocab.json', 'target_vocab.json', 'source.spm', 'target.spm')
    for name in (*names, 'tokenizer_config.json', 'special_tokens_map.json'):
        assert (out / name).read_bytes() == (Path(hf_dir) / name).read_bytes(), name
    for name in ('config.json', 'generation_config.json'):
        source = json.loads((Path(hf_dir) / name).read_text())
        assert json.loads((out / name).read_text()) == source, name


def test_ctranslate2_export_stops_in_one_line(run_dir, tmp_path):
    out = tmp_path / 'ct2'
    error = _cli(export, f'--workdir={run_dir}', f'--out={out}', '--format=ctranslate2')
    assert 'separate_vocabs' in error and '\n' not in error, error
    assert not out.exists()


def _target_size(copy):
    """config.json's decoder_vocab_size is not target_vocab.json's size."""
    config = json.loads((copy / 'config.json').read_text())
    config['decoder_vocab_size'] = config['vocab_size']
    (copy / 'config.json').write_text(json.dumps(config))


def _shared(copy):
    """Separate vocabularies with one shared table in config.json."""
    config = json.loads((copy / 'config.json').read_text())
    config['share_encoder_decoder_embeddings'] = True
    (copy / 'config.json').write_text(json.dumps(config))


def _joint_tokenizer(copy):
    """A joint tokenizer (separate_vocabs false) with a decoder vocabulary of its own."""
    tokenizer_config = json.loads((copy / 'tokenizer_config.json').read_text())
    tokenizer_config['separate_vocabs'] = False
    (copy / 'tokenizer_config.json').write_text(json.dumps(tokenizer_config))


def _no_target_vocab(copy):
    (copy / 'target_vocab.json').unlink()


@pytest.mark.parametrize(
    'edit, message',
    [
        (_target_size, 'decoder_vocab_size=147 but target_vocab.json holds 127 pieces'),
        (_shared, 'share_encoder_decoder_embeddings=True is not expressible'),
        (_joint_tokenizer, 'decoder_vocab_size=127 differs from vocab_size=147'),
        (_no_target_vocab, 'target_vocab.json does not exist'),
    ],
)
def test_inconsistent_directories_stop_in_one_line_naming_the_key(hf_dir, tmp_path, edit, message):
    copy = tmp_path / 'hf'
    shutil.copytree(hf_dir, copy)
    edit(copy)
    error = _convert_error(copy, tmp_path / 'run')
    assert error.startswith('error: ') and message in error and '\n' not in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf']  # nothing written


def _convert_error(directory, out):
    return _cli(convert, f'--from_hf={directory}', f'--workdir={out}')


def test_tokens_cannot_be_added_to_separate_vocabularies(hf_dir, tmp_path):
    error = _cli(
        convert, f'--from_hf={hf_dir}', f'--workdir={tmp_path / "run"}', '--add_tokens=<bt>'
    )
    assert 'separate source and target vocabularies' in error and '\n' not in error, error
    assert not (tmp_path / 'run').exists()
