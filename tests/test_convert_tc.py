"""transformer.convert on the layout of OPUS-MT's Tatoeba-Challenge generation (opus-mt-tc-*):
special ids where vocab.json puts them, relu, several targets, max_position_embeddings 64. The
run computes what Hugging Face's own code computes on the same directory, and its export gives
the directory back. (The first generation's layout: tests/test_convert.py.)"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import ctranslate2_child
from tests.marian_dir import (
    LANGUAGE_TOKENS,
    TC,
    TRAINED_LINES,
    hf_log_probs,
    marian_dir,
    synthetic_lines,
)
from tests.tiny_run import DECODE_BATCH
from transformer import api, convert, export
from transformer.checkpoint import load_model
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

PAIRS = synthetic_lines()
# Sources as the model was trained on them: each with its language code (tests/marian_dir.py).
TAGGED = [(f'{LANGUAGE_TOKENS[i % 3]} {s}', t) for i, (s, t) in enumerate(PAIRS)]
# Unknown pieces and characters, a code not at the start, an unknown code, special-token text.
ODD = ['>>pob<< Ze BLAND 42 .', 'ze >>fra<< bland', '>>xyz<< ze', 'ze </s> bland<unk> <pad> .']


def _cli(module, *args):
    with pytest.raises(SystemExit) as info:
        module.cli([module.__name__.rsplit('.', 1)[-1], *args])
    return info.value.code


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory, **TC)


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


def test_the_fixture_has_the_tc_layout(hf_dir):
    config = json.load(open(os.path.join(hf_dir, 'config.json')))
    vocab = json.load(open(os.path.join(hf_dir, 'vocab.json')))
    size = len(vocab)
    assert 0 < vocab['</s>'] < vocab['<unk>'] < vocab['<pad>'] == size - 1
    assert config['eos_token_id'] == vocab['</s>'] and config['activation_function'] == 'relu'
    assert config['decoder_start_token_id'] == config['pad_token_id'] == vocab['<pad>']
    assert config['max_position_embeddings'] == 64


def test_token_ids_equal_marian_tokenizers(loaded, hf):
    """Both sides, on lines with codes, unknown pieces and special-token strings: ours are
    MarianTokenizer's through the vocabulary's permutation (a '</s>' or '<pad>' written in the
    text is unknown here, eos or pad there: transformer/interop/marian_vocab.py)."""
    _, tokenizer, *_ = loaded
    theirs = hf[1]
    ours_of = np.array([tokenizer.our_id(m) for m in range(tokenizer.vocab_size)])
    unknown = 0
    for source, target in [*TAGGED[:40], *((line, line) for line in ODD)]:
        for side, ids in (
            ('source', theirs(source)['input_ids']),
            ('target', theirs(text_target=target)['input_ids']),
        ):
            text = source if side == 'source' else target
            expected = [int(i) for i in ours_of[ids]]
            assert expected[-1] == EOS_ID
            expected = [UNK_ID if i in (EOS_ID, PAD_ID) else i for i in expected[:-1]]
            assert tokenizer.encode(text, side) == expected, (side, text)
            unknown += expected.count(UNK_ID)
    assert unknown > 10  # the lines hold unknown pieces
    assert tokenizer.encode(TAGGED[0][0])[0] == tokenizer.token_id(LANGUAGE_TOKENS[0]) > 2


@pytest.mark.slow
def test_teacher_forced_log_probs_equal_marians(loaded, hf):
    """log P of every position of a padded batch, every vocabulary row: ours (float32, full
    precision) equal MarianMTModel's to 1e-4."""
    _, tokenizer, model, params, _ = loaded
    hf_model, theirs = hf
    pairs = TAGGED[:16]
    batch = theirs([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True)
    inputs, labels = np.array(batch['input_ids']), np.array(batch['labels'])
    assert (inputs == theirs.pad_token_id).any()
    expected = hf_log_probs(hf_model, batch)
    ours_of = np.array([tokenizer.our_id(m) for m in range(tokenizer.vocab_size)])
    with jax.default_matmul_precision('float32'):
        ours = jax.jit(model.apply)(  # one program: eagerly, each operation compiles
            {'params': params}, jnp.asarray(ours_of[inputs]), jnp.asarray(ours_of[labels])
        )
    ours = np.asarray(jax.nn.log_softmax(ours, -1))[..., ours_of]  # Marian's row order
    real = labels != theirs.pad_token_id
    np.testing.assert_allclose(ours[real], expected[real], atol=1e-4, rtol=0)
    assert np.abs(ours[real]).max() > 1.0


@pytest.mark.slow
def test_greedy_outputs_equal_generates(run_dir, hf):
    """Greedy outputs equal generate(num_beams=1) with the directory's generation config
    (max_length 64, eos mid-vocabulary, pad never generated), on the learned lines of one
    language code."""
    hf_model, theirs = hf
    code = LANGUAGE_TOKENS[1]
    lines = [s for s, _ in PAIRS[:TRAINED_LINES]][1::3]
    batch = theirs([f'{code} {line}' for line in lines], padding=True, return_tensors='pt')
    with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=1)
    expected = theirs.batch_decode(out, skip_special_tokens=True)
    assert len(set(expected)) > len(lines) // 2  # distinct outputs, not one repeated
    assert (
        api.load(run_dir).translate(lines, beam_size=1, source_tag=code, batch_size=DECODE_BATCH)
        == expected
    )


@pytest.mark.slow
def test_beam_outputs_and_scores_equal_generates(run_dir, hf):
    """Beam 4 with the directory's generation config (num_beams 4, length_penalty 1.0,
    max_length 64, eos mid-vocabulary, pad never generated): the run's own settings give
    generate's outputs, and each best hypothesis' score (log P / length^1.0, EOS counted)
    equals generate's sequences_scores, on the learned lines of one language code.

    As for the first generation's layout (tests/test_convert_decoding.py), the searches can
    part elsewhere in ways no setting records: generate's stopping heuristic and its rule
    that a hypothesis + EOS finishes only among the 2K best continuations. On these lines
    they do not: the assertions below pin equal texts and scores, no difference left."""
    hf_model, theirs = hf
    code = LANGUAGE_TOKENS[2]
    lines = [s for s, _ in PAIRS[:TRAINED_LINES]][2::3]
    batch = theirs([f'{code} {line}' for line in lines], padding=True, return_tensors='pt')
    with torch.no_grad():
        out = hf_model.generate(**batch, output_scores=True, return_dict_in_generate=True)
    assert hf_model.generation_config.num_beams == 4
    expected = theirs.batch_decode(out.sequences, skip_special_tokens=True)
    best = [
        h[0]
        for h in api.load(run_dir).translate(
            lines, nbest=1, source_tag=code, batch_size=DECODE_BATCH
        )
    ]
    assert [h.text for h in best] == expected
    ours = np.array([h.score for h in best])
    np.testing.assert_allclose(ours, out.sequences_scores.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_export_gives_back_the_directory(run_dir, hf_dir, tmp_path):
    """Round trip: every tensor equal, the tokenizer files byte for byte, config.json's and
    generation_config.json's values (the special ids and max_position_embeddings 64)."""
    from safetensors.numpy import load_file

    out = tmp_path / 'hf'
    assert _cli(export, f'--workdir={run_dir}', f'--out={out}') is None
    original, exported = (load_file(os.path.join(d, 'model.safetensors')) for d in (hf_dir, out))
    assert sorted(original) == sorted(exported)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    for name in ('vocab.json', 'source.spm', 'target.spm', 'tokenizer_config.json'):
        assert (out / name).read_bytes() == open(os.path.join(hf_dir, name), 'rb').read(), name
    assert (out / 'special_tokens_map.json').is_file()
    for name in ('config.json', 'generation_config.json'):
        source = json.load(open(os.path.join(hf_dir, name)))
        assert json.loads((out / name).read_text()) == source, name
    assert json.loads((out / 'config.json').read_text())['max_position_embeddings'] == 64


@pytest.mark.slow
def test_ctranslate2_export_translates_as_ours(run_dir, tmp_path):
    """--format ctranslate2 of the converted run: CTranslate2's greedy outputs equal ours (its
    vocabulary in our order, the decoder starting from '<pad>' wherever vocab.json has it)."""
    pytest.importorskip('ctranslate2', reason=_SKIP.format('ctranslate2'))
    import sentencepiece as spm

    out = tmp_path / 'ct2'
    assert _cli(export, f'--workdir={run_dir}', f'--out={out}', '--format=ctranslate2') is None
    code, lines = LANGUAGE_TOKENS[1], [s for s, _ in PAIRS[:TRAINED_LINES]][1::3]
    source = spm.SentencePieceProcessor(model_file=str(out / 'source.spm'))
    target = spm.SentencePieceProcessor(model_file=str(out / 'target.spm'))
    batch = [[code, *source.encode(line, out_type=str), '</s>'] for line in lines]
    hypotheses = ctranslate2_child.translate(out, batch, beam_size=1)
    theirs = [target.decode([p for p in h if p != '<unk>']) for h in hypotheses]
    assert (
        api.load(run_dir).translate(lines, beam_size=1, source_tag=code, batch_size=DECODE_BATCH)
        == theirs
    )


def _edited(hf_dir, tmp_path, name, edit):
    copy = tmp_path / 'hf'
    shutil.copytree(hf_dir, copy)
    path = copy / name
    value = json.loads(path.read_text(encoding='utf-8'))
    path.write_text(json.dumps(edit(value)), encoding='utf-8')
    return copy


def _without_eos(vocab):
    eos = vocab.pop('</s>')
    return {p: i - (i > eos) for p, i in vocab.items()}


@pytest.mark.parametrize(
    'name, edit, message',
    [
        ('vocab.json', _without_eos, "vocab.json has no '</s>'"),
        ('config.json', lambda c: {**c, 'eos_token_id': 0}, 'config.json: eos_token_id=0 is not'),
        ('config.json', lambda c: {**c, 'pad_token_id': 3}, 'config.json: pad_token_id=3'),
        (
            'generation_config.json',
            lambda c: {**c, 'forced_eos_token_id': 5},
            'generation_config.json: forced_eos_token_id=5',
        ),
        (
            'config.json',
            lambda c: {**c, 'decoder_start_token_id': c['eos_token_id']},
            'decoder_start_token_id=',
        ),
    ],
)
def test_special_ids_that_disagree_stop_in_one_line(hf_dir, tmp_path, name, edit, message):
    copy = _edited(hf_dir, tmp_path, name, edit)
    out = tmp_path / 'run'
    error = _cli(convert, f'--from_hf={copy}', f'--workdir={out}')
    assert error.startswith('error: ') and message in error and '\n' not in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf']  # nothing written
