"""transformer.convert: a Hugging Face MarianMT becomes a run directory that computes what
Hugging Face's own torch implementation computes, and exports back to the same tensors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import ctranslate2_child
from tests.cli import convert_cli
from tests.marian_dir import hf_log_probs, marian_dir, synthetic_lines
from tests.shared_dirs import built_once
from tests.tiny_run import DECODE_BATCH
from transformer import api, convert, export
from transformer.checkpoint import load_model
from transformer.tokens import EOS_ID

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))
MarianMTModel, MarianTokenizer = transformers.MarianMTModel, transformers.MarianTokenizer

LINES = [s for s, _ in synthetic_lines()]
# The greedy comparisons decode the first 8 of the lines the model learned (marian_dir's
# TRAINED_LINES): fewer stages of the search's shrinking batch to compile than with 32.
GREEDY = 8
ONE = jax.devices()[:1]  # the searches' devices: `run`'s


def _convert(hf_dir, out, *args):
    message = convert_cli(f'--from_hf={hf_dir}', f'--workdir={out}', *args)
    assert message is None, message
    return str(out)


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory)


@pytest.fixture(scope='module')
def run_dir(hf_dir, tmp_path_factory):
    return _convert(hf_dir, tmp_path_factory.mktemp('converted') / 'run')


@pytest.fixture(scope='module')
def hf_model(hf_dir):
    return MarianMTModel.from_pretrained(hf_dir).eval()


@pytest.fixture(scope='module')
def hf_tokenizer(hf_dir):
    return MarianTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope='module')
def loaded(run_dir):
    return load_model(run_dir)


@pytest.fixture(scope='module')
def run(run_dir):
    # One device: what the greedy outputs are does not depend on the number, and one device's
    # programs compile faster than the 8 host devices' (tests/compiles.py).
    return api.load(run_dir, devices=ONE)


@pytest.fixture(scope='module')
def greedy(request, tmp_path_factory):
    """(ours, Hugging Face's) greedy outputs of `GREEDY` lines the model learned: decoded once
    for both pytest-xdist workers (tests/shared_dirs.py), whose tests of this module may split."""

    def decode(path):
        lines = LINES[:GREEDY]
        hf = [request.getfixturevalue(name) for name in ('hf_model', 'hf_tokenizer')]
        ours = request.getfixturevalue('run').translate(lines, beam_size=1, batch_size=DECODE_BATCH)
        path.mkdir()
        (path / 'greedy.json').write_text(json.dumps([ours, _generate(*hf, lines, 1)]))

    path = built_once(tmp_path_factory, 'convert-greedy', decode) / 'greedy.json'
    ours, theirs = json.loads(path.read_text())
    return ours, theirs


def _marian_ids(ours: np.ndarray, vocab_size: int) -> np.ndarray:
    """Marian's id of each of ours: ours = (marian + 1) mod V."""
    return (np.asarray(ours) - 1) % vocab_size


def test_converted_run_records_the_model(run_dir, hf_dir):
    with open(os.path.join(run_dir, 'config.json')) as f:
        config = json.load(f)
    hf = json.load(open(os.path.join(hf_dir, 'config.json')))
    model = config['model']
    assert (model['d_model'], model['d_ff'], model['num_heads']) == (
        hf['d_model'],
        hf['encoder_ffn_dim'],
        hf['encoder_attention_heads'],
    )
    assert model['ffn'] == 'swish' and model['attention_bias'] and model['logits_bias']
    assert model['layer_norm_epsilon'] == 1e-5
    assert config['data']['dataset'] == 'none' and config['data']['source_lang'] == 'en'
    assert config['eval']['beam_size'] == 4 and config['eval']['length_penalty'] == 'fairseq'
    assert os.path.isfile(os.path.join(run_dir, 'checkpoints', '0', 'manifest.json'))


def test_a_conversion_takes_how_the_model_is_computed_as_resume_and_init_from_do(
    hf_dir, loaded, tmp_path
):
    """model.HOW_FIELDS is the one list of how (not what) the model is computed: a resume may
    change them, a fine-tuning's config set them, and a conversion's config set them too:
    converted with scan_layers=True and remat='full', the run holds its layers stacked, and
    they are the per-layer run's parameters."""
    from tests.tiny_run import tiny_run_config
    from transformer import run_changes
    from transformer.model import HOW_FIELDS, STACKED_KEYS
    from transformer.training import init_from

    resume_free = {key for key in run_changes.RESUME_FREE if key.startswith('model.')}
    assert resume_free == {f'model.{name}' for name in HOW_FIELDS}
    assert set(init_from.FREE_MODEL_FIELDS) >= set(HOW_FIELDS)
    assert set(convert.FREE_FIELDS) >= set(HOW_FIELDS)
    base = tiny_run_config(1)
    base.model.update(scan_layers=True, remat='full')
    config = convert.convert(hf_dir, str(tmp_path / 'run'), base)
    assert config.model.scan_layers and config.model.remat == 'full'
    stacked = load_model(str(tmp_path / 'run'))[3]
    assert set(STACKED_KEYS) <= set(stacked)
    unrolled = load_model(str(tmp_path / 'run'), scan_layers=False)[3]
    jax.tree.map(np.testing.assert_array_equal, unrolled, loaded[3])


def test_teacher_forced_log_probs_equal_marians(loaded, hf_model, hf_tokenizer):
    """log P(target token | ...) of every position of a padded batch: ours (float32, full
    precision) equal MarianMTModel's to 1e-4, every vocabulary row in Marian's order."""
    config, tokenizer, model, params, _ = loaded
    pairs = synthetic_lines()[:16]
    batch = hf_tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True)
    inputs = np.array(batch['input_ids'])
    labels = np.array(batch['labels'])
    assert (inputs == hf_tokenizer.pad_token_id).any()  # the batch has padding
    vocab = tokenizer.vocab_size
    theirs = hf_log_probs(hf_model, batch)
    with jax.default_matmul_precision('float32'):
        logits = jax.jit(model.apply)(  # one program: eagerly, each operation compiles
            {'params': params},
            jnp.asarray((inputs + 1) % vocab),
            jnp.asarray((labels + 1) % vocab),
        )
    ours = np.asarray(jax.nn.log_softmax(logits, -1))[..., (np.arange(vocab) + 1) % vocab]
    real = labels != hf_tokenizer.pad_token_id
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)
    assert np.abs(ours[real]).max() > 1.0  # not a trivial distribution


def test_token_ids_equal_marian_tokenizers(loaded, hf_tokenizer):
    _, tokenizer, *_ = loaded
    vocab = tokenizer.vocab_size
    for source, target in synthetic_lines()[:50]:
        theirs = hf_tokenizer(source)['input_ids']
        assert [*tokenizer.encode(source), EOS_ID] == [(i + 1) % vocab for i in theirs]
        theirs = hf_tokenizer(text_target=target)['input_ids']
        assert [*tokenizer.encode(target, 'target'), EOS_ID] == [(i + 1) % vocab for i in theirs]


def _generate(hf_model, hf_tokenizer, lines, num_beams):
    batch = hf_tokenizer(lines, padding=True, return_tensors='pt')
    with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=num_beams, max_new_tokens=60)
    return hf_tokenizer.batch_decode(out, skip_special_tokens=True)


def test_greedy_outputs_equal_generates(greedy):
    """Greedy outputs equal generate(num_beams=1) on the lines the model learned (beam search
    against generate's: tests/test_convert_decoding.py)."""
    assert greedy[0] == greedy[1]


@pytest.mark.slow
def test_export_gives_back_the_original_tensors_and_files(run_dir, hf_dir, tmp_path):
    """Round trip: the export of a converted run holds the original's tensors, its
    vocabulary files byte for byte and its config.json's and generation_config.json's values
    (max_position_embeddings 512, which an export of a run trained here sizes otherwise)."""
    from safetensors.numpy import load_file

    recorded = json.load(open(os.path.join(run_dir, 'converted_from.json')))
    assert recorded['family'] == 'marian'  # the family --format hf writes back
    out = tmp_path / 'hf'
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={run_dir}', f'--out={out}'])
    assert info.value.code is None, info.value.code
    original, exported = (load_file(os.path.join(d, 'model.safetensors')) for d in (hf_dir, out))
    assert sorted(original) == sorted(exported)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    assert np.abs(exported['final_logits_bias']).max() > 0
    for name in ('vocab.json', 'source.spm', 'target.spm', 'tokenizer_config.json'):
        with open(os.path.join(hf_dir, name), 'rb') as a, open(os.path.join(out, name), 'rb') as b:
            assert a.read() == b.read(), name
    for name in ('config.json', 'generation_config.json'):
        source = json.load(open(os.path.join(hf_dir, name)))
        assert json.load(open(os.path.join(out, name))) == source, name
    config = json.load(open(os.path.join(out, 'config.json')))
    assert config['activation_function'] == 'swish' and config['max_position_embeddings'] == 512
    assert config['pad_token_id'] == config['vocab_size'] - 1 and config['eos_token_id'] == 0


@pytest.mark.slow
def test_ctranslate2_export_of_a_converted_run_translates_as_ours(run_dir, greedy, tmp_path):
    pytest.importorskip('ctranslate2', reason=_SKIP.format('ctranslate2'))
    import sentencepiece as spm

    out = tmp_path / 'ct2'
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={run_dir}', f'--out={out}', '--format=ctranslate2'])
    assert info.value.code is None, info.value.code
    lines = LINES[:GREEDY]
    source = spm.SentencePieceProcessor(model_file=str(out / 'source.spm'))
    target = spm.SentencePieceProcessor(model_file=str(out / 'target.spm'))
    hypotheses = ctranslate2_child.translate(
        out, [[*source.encode(line, out_type=str), '</s>'] for line in lines], beam_size=1
    )
    # '<unk>' is no piece of target.spm: dropped, as MarianTokenizer's decode drops it.
    theirs = [target.decode([p for p in h if p != '<unk>']) for h in hypotheses]
    assert greedy[0] == theirs


def _copy_with_weights(hf_dir, directory, state, name):
    """``hf_dir`` with its weights replaced by ``state`` written as ``name``."""
    shutil.copytree(hf_dir, directory, ignore=shutil.ignore_patterns('model.safetensors'))
    if name == 'pytorch_model.bin':
        torch.save({k: torch.from_numpy(v) for k, v in state.items()}, directory / name)
    else:
        from safetensors.numpy import save_file

        save_file(state, str(directory / name), metadata={'format': 'pt'})
    return directory


def _weights(hf_dir):
    from safetensors.numpy import load_file

    return load_file(os.path.join(hf_dir, 'model.safetensors'))


def test_a_pytorch_model_bin_converts_to_the_same_parameters(hf_dir, loaded, tmp_path):
    """The same tensors saved by torch.save as pytorch_model.bin (older hub repositories)."""
    copy = _copy_with_weights(hf_dir, tmp_path / 'hf', _weights(hf_dir), 'pytorch_model.bin')
    params = load_model(_convert(copy, tmp_path / 'run'))[3]
    jax.tree.map(np.testing.assert_array_equal, params, loaded[3])


@pytest.mark.slow
def test_a_float16_checkpoint_converts_and_translates_alike(hf_dir, loaded, greedy, tmp_path):
    """float16 weights: the float32 parameters rounded to float16, and the same greedy
    outputs on the learned lines."""
    half = {k: v.astype(np.float16) for k, v in _weights(hf_dir).items()}
    copy = _copy_with_weights(hf_dir, tmp_path / 'hf', half, 'model.safetensors')
    run_dir = _convert(copy, tmp_path / 'run')
    rounded = jax.tree.map(lambda x: np.asarray(x, np.float16).astype(np.float32), loaded[3])
    jax.tree.map(np.testing.assert_array_equal, load_model(run_dir)[3], rounded)
    assert (
        api.load(run_dir, devices=ONE).translate(
            LINES[:GREEDY], beam_size=1, batch_size=DECODE_BATCH
        )
        == greedy[0]
    )


@pytest.fixture(scope='module')
def multilingual(tmp_path_factory):
    """(Hugging Face directory, converted run) of a multilingual MarianMT: converted once for
    the tests that read it (translating writes nothing into the run)."""
    hf_dir = marian_dir(tmp_path_factory, multilingual=True)
    return hf_dir, _convert(hf_dir, tmp_path_factory.mktemp('multilingual') / 'run')


def test_multilingual_source_tag_goes_first_as_its_id(multilingual):
    hf_dir, run_dir = multilingual
    hf_tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    with pytest.raises(ValueError, match=r'multilingual \(3 such tokens: >>'):
        api.load(run_dir).translate(['a'])
    run = api.load(run_dir, source_tag='>>fra<<')
    tagged = run._languages(None, None, None).tokenizer
    vocab = tagged.vocab_size
    line = LINES[3]
    theirs = [(i + 1) % vocab for i in hf_tokenizer(f'>>fra<< {line}')['input_ids']]
    assert [*tagged.encode(line), EOS_ID] == theirs
    assert tagged.encode('>>fra<< x')[1:] != tagged.encode('x')[1:]  # text stays text
    with pytest.raises(ValueError, match=r"'>>xyz<<' is not a token"):
        run.translate(['a'], source_tag='>>xyz<<')


def _edit_copy(hf_dir, tmp_path, edit_config=None, remove=None):
    copy = tmp_path / 'hf'
    shutil.copytree(hf_dir, copy)
    if edit_config:
        path = copy / 'config.json'
        config = json.loads(path.read_text())
        config.update(edit_config)
        path.write_text(json.dumps(config))
    if remove:
        os.remove(copy / remove)
    return copy


@pytest.mark.parametrize(
    'edit, remove, message',
    [
        (None, 'vocab.json', 'vocab.json'),
        (None, 'model.safetensors', 'weights are missing'),
        ({'model_type': 'bart'}, None, "model_type='bart'"),
        # The M2M100 family reads it, and refuses Marian's ids.
        ({'model_type': 'm2m_100'}, None, "is not 1 (fairseq's <pad>)"),
        ({'decoder_vocab_size': 7}, None, 'decoder_vocab_size=7'),
        ({'activation_function': 'tanh'}, None, "activation_function='tanh'"),
        ({'decoder_attention_heads': 2}, None, 'decoder_attention_heads=2'),
        # Every config.json key the reader checks (docs/pretrained.md lists them).
        ({'decoder_ffn_dim': 32}, None, 'decoder_ffn_dim=32'),
        ({'activation_function': 'gelu_new'}, None, "activation_function='gelu_new'"),
        ({'scale_embedding': False}, None, 'scale_embedding=False'),
        ({'tie_word_embeddings': False}, None, 'tie_word_embeddings=False'),
        ({'d_model': 34}, None, 'd_model=34'),
    ],
)
def test_bad_input_stops_in_one_line_and_writes_nothing(hf_dir, tmp_path, edit, remove, message):
    copy = _edit_copy(hf_dir, tmp_path, edit, remove)
    out = tmp_path / 'run'
    error = convert_cli(f'--from_hf={copy}', f'--workdir={out}')
    assert error.startswith('error: ') and message in error and '\n' not in error, error
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf']  # no staging left behind


def test_an_existing_workdir_is_refused(hf_dir, tmp_path):
    out = tmp_path / 'run'
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    error = convert_cli(f'--from_hf={hf_dir}', f'--workdir={out}')
    assert 'exists and is not empty' in error
    assert [p.name for p in out.iterdir()] == ['notes.txt']


def test_evaluate_scores_any_pair_of_files(run_dir, greedy, tmp_path):
    from transformer import evaluate

    pairs = synthetic_lines()[:GREEDY]
    source, reference = tmp_path / 'src.txt', tmp_path / 'ref.txt'
    source.write_text(''.join(s + '\n' for s, _ in pairs))
    reference.write_text(''.join(t + '\n' for _, t in pairs))
    scores = evaluate.run(
        run_dir,
        files=(str(source), str(reference)),
        beam_size=1,
        batch_size=DECODE_BATCH,
        output=str(tmp_path / 'h.txt'),
        devices=ONE,  # the greedy fixture's search, compiled once
    )
    assert scores['split'] == 'src.txt' and scores['sacrebleu'] > 50
    hypotheses = (tmp_path / 'h.txt').read_text().splitlines()
    assert hypotheses == greedy[0]


def test_translate_command_takes_the_source_tag(multilingual, tmp_path, capsys):
    """The command line: a multilingual run stops without --source_tag, translates with it."""
    from transformer import translate

    run_dir = multilingual[1]
    source = tmp_path / 'in.txt'
    source.write_text(LINES[0] + '\n')

    def translated(*flags):
        with pytest.raises(SystemExit) as info:
            translate.cli(['translate', f'--workdir={run_dir}', f'--input={source}', *flags])
        return info.value.code

    error = translated()
    assert 'multilingual (3 such tokens' in error and "--source_tag='>>fra<<'" in error
    capsys.readouterr()
    assert translated('--source_tag=>>deu<<', '--beam_size=1', f'--batch_size={DECODE_BATCH}') in (
        None,
        0,
    )
    assert capsys.readouterr().out.count('\n') == 1
    assert "'>>xx<<' is not a token" in translated('--source_tag=>>xx<<')
