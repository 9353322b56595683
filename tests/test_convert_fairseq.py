"""transformer.convert of fairseq's families: a tiny M2M100, an NLLB-200-style M2M100 (its
tokenizer NllbTokenizer's files) and an mBART-50, built by transformers with every weight
drawn, beside the tokenizer directories of tests/fairseq_dirs.py, become run directories that
compute Hugging Face's log-probabilities through the run directory, start fine-tuning from
their weights and export back to the same tensors and tokenizer files."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.cli import convert_cli
from tests.fairseq_dirs import lines
from tests.fairseq_models import MODELS
from transformer import api, export, interop
from transformer.checkpoint import load_model
from transformer.interop import fairseq_config, fairseq_vocab
from transformer.interop.fairseq_backend import FAIRSEQ_SPECIAL

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))


def _hf(fairseq_hf_dirs, name):
    _, (_, model_class, tokenizer_class), _, (src, tgt), _ = MODELS[name]
    model = getattr(transformers, model_class).from_pretrained(fairseq_hf_dirs / name).eval()
    tokenizer = getattr(transformers, tokenizer_class).from_pretrained(
        fairseq_hf_dirs / name, src_lang=src, tgt_lang=tgt
    )
    return model, tokenizer


def test_the_special_ids_are_declared_once_and_are_the_tokenizers():
    ids = fairseq_config.FAIRSEQ_IDS
    assert fairseq_vocab.FAIRSEQ is ids
    assert [FAIRSEQ_SPECIAL[i] for i in (ids.pad, ids.eos, ids.unk)] == ['<pad>', '</s>', '<unk>']
    assert (ids.pad, ids.eos, ids.unk, ids.decoder_start) == (1, 2, 3, 2)


def test_each_familys_directories_are_recognised_by_exactly_one_family(fairseq_hf_dirs, tmp_path):
    """Model directories by config.json's model_type, vocabulary directories (a run's
    vocab/) by the files only that family has: an M2M100's vocab.json is no MarianMT's."""
    wanted = {'m2m100': 'm2m100', 'nllb': 'm2m100', 'mbart50': 'mbart'}
    for name, family in wanted.items():
        directory = str(fairseq_hf_dirs / name)
        assert [f.name for f in interop.FAMILIES if f.recognises(directory)] == [family]
        assert [f.name for f in interop.FAMILIES if f.holds_vocabulary(directory)] == [family]
    marian = tmp_path / 'marian'  # the files a MarianMT directory has (their names alone)
    marian.mkdir()
    (marian / 'config.json').write_text(json.dumps({'model_type': 'marian'}))
    for file in ('source.spm', 'target.spm', 'vocab.json'):
        (marian / file).write_text('{}')
    marian = str(marian)
    assert [f.name for f in interop.FAMILIES if f.recognises(marian)] == ['marian']
    assert [f.name for f in interop.FAMILIES if f.holds_vocabulary(marian)] == ['marian']


@pytest.mark.parametrize('name', MODELS)
def test_the_run_records_the_family_and_fairseqs_special_ids(fairseq_hf_dirs, fairseq_runs, name):
    config = json.loads((fairseq_runs / name / 'config.json').read_text())
    recorded = json.loads((fairseq_runs / name / 'converted_from.json').read_text())
    assert recorded['family'] == {'mbart50': 'mbart'}.get(name, 'm2m100')
    data = config['data']
    assert (data['pad_id'], data['eos_id'], data['unk_id'], data['decoder_start_id']) == (
        1,
        2,
        3,
        2,
    )
    _, _, _, (src, tgt), extra = MODELS[name]
    assert (data['source_lang'], data['target_lang']) == (src, tgt)
    rows = json.loads((fairseq_hf_dirs / name / 'config.json').read_text())
    assert data['vocab_size'] == rows['vocab_size']


@pytest.mark.slow  # transformers' models and tokenizers are loaded
@pytest.mark.parametrize('name', MODELS)
def test_teacher_forced_log_probs_through_the_run_equal_hugging_faces(
    fairseq_hf_dirs, fairseq_runs, name
):
    """The run's vocabulary builds a language pair's ids (`pair`): they are Hugging Face's
    tokenizer's, and the run's model gives its log-probabilities to 1e-4 on a padded batch."""
    _, _, _, (src, tgt), _ = MODELS[name]
    hf_model, hf_tokenizer = _hf(fairseq_hf_dirs, name)
    config, tokenizer, model, params, _ = load_model(str(fairseq_runs / name))
    pairs = lines(6)
    ours = [tokenizer.pair(s, t, src, tgt) for s, t in pairs]
    batch = hf_tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True)
    for (source, target), theirs_source, theirs_target in zip(
        ours, batch['input_ids'], batch['labels'], strict=True
    ):
        assert source == [i for i in theirs_source if i != 1]
        assert target == [i for i in theirs_target if i != 1]
    inputs, labels = np.array(batch['input_ids']), np.array(batch['labels'])
    with torch.no_grad():
        logits = hf_model(
            input_ids=torch.as_tensor(inputs),
            attention_mask=torch.as_tensor(inputs != 1).long(),
            labels=torch.as_tensor(labels),
        ).logits
    theirs = torch.log_softmax(logits, -1).numpy()
    with jax.default_matmul_precision('float32'):
        logits = jax.jit(model.apply)(  # one program: eagerly, each operation compiles
            {'params': params}, jnp.asarray(inputs), jnp.asarray(labels)
        )
    mine = np.asarray(jax.nn.log_softmax(logits, -1))
    real = labels != 1
    assert (inputs == 1).any() and np.abs(theirs[real]).max() > 1
    np.testing.assert_allclose(mine[real], theirs[real], atol=1e-4, rtol=0)
    assert api.load(str(fairseq_runs / name)).tokenizer.vocab_size == tokenizer.vocab_size


@pytest.mark.slow  # three exports, each read back by transformers
@pytest.mark.parametrize('name', MODELS)
def test_export_gives_back_every_tensor_and_the_tokenizer_files(
    fairseq_hf_dirs, fairseq_runs, name, tmp_path
):
    """--format hf: every tensor equal, config values back, and Hugging Face's tokenizer
    reads the written files with the same ids."""
    from safetensors.numpy import load_file

    out = tmp_path / 'hf'
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={fairseq_runs / name}', f'--out={out}'])
    assert info.value.code is None, info.value.code
    original = load_file(fairseq_hf_dirs / name / 'model.safetensors')
    exported = load_file(out / 'model.safetensors')
    assert sorted(original) == sorted(exported)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    source = json.loads((fairseq_hf_dirs / name / 'config.json').read_text())
    written = json.loads((out / 'config.json').read_text())
    assert {k: v for k, v in written.items() if k != 'dtype'} == {
        k: v for k, v in source.items() if k not in ('dtype', 'torch_dtype')
    }
    _, _, _, (src, tgt), _ = MODELS[name]
    _, theirs = _hf(fairseq_hf_dirs, name)
    back = _reread(out, name, src, tgt)
    for source_line, target_line in lines(20):
        a = theirs(source_line, text_target=target_line)
        b = back(source_line, text_target=target_line)
        assert a['input_ids'] == b['input_ids'] and a['labels'] == b['labels']
    assert len(back) >= len(theirs)


def _reread(directory, name, src, tgt):
    tokenizer_class = MODELS[name][1][2]
    return getattr(transformers, tokenizer_class).from_pretrained(
        directory, src_lang=src, tgt_lang=tgt
    )


def _copy(fairseq_hf_dirs, tmp_path, name):
    directory = tmp_path / name
    shutil.copytree(fairseq_hf_dirs / name, directory)
    return directory


def test_an_m2m100_whose_vocab_json_and_config_disagree_stops_in_one_line(
    fairseq_hf_dirs, tmp_path
):
    directory = _copy(fairseq_hf_dirs, tmp_path, 'm2m100')
    config = json.loads((directory / 'config.json').read_text())
    config['vocab_size'] -= 5
    (directory / 'config.json').write_text(json.dumps(config))
    message = convert_cli(f'--from_hf={directory}', f'--workdir={tmp_path / "run"}')
    assert 'vocab_size' in message and 'fewer than' in message and '\n' not in message
    assert not (tmp_path / 'run').exists()


def test_a_directory_no_family_reads_names_the_three_families(tmp_path):
    directory = tmp_path / 'bart'
    directory.mkdir()
    (directory / 'config.json').write_text(json.dumps({'model_type': 'bart'}))
    message = convert_cli(f'--from_hf={directory}', f'--workdir={tmp_path / "run"}')
    assert "model_type='bart'" in message and '\n' not in message
    for family in ('marian', 'm2m100', 'mbart'):
        assert family in message
    assert not (tmp_path / 'run').exists()


def test_init_from_the_directory_starts_from_its_weights(fairseq_hf_dirs, fairseq_runs):
    """``train.init_from`` of the Hugging Face directory starts from the parameters of its
    converted run (the ones proven against Hugging Face's above), every tensor equal (a run
    that trains from one: tests/test_finetune_languages.py)."""
    from transformer.training import init_from

    *_, converted, _ = load_model(str(fairseq_runs / 'nllb'), scan_layers=False)
    start = init_from.start_params(init_from.read_start(str(fairseq_hf_dirs / 'nllb')), converted)
    flat = jax.tree_util.tree_leaves_with_path
    assert [p for p, _ in flat(start)] == [p for p, _ in flat(converted)]
    for (path, a), (_, b) in zip(flat(start), flat(converted), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


@pytest.mark.slow  # a conversion and an export read back by transformers
def test_a_language_code_added_at_conversion_exports_as_a_code_hugging_face_reads(
    fairseq_hf_dirs, tmp_path
):
    """``--add_tokens=abc_Latn=zul_Latn``: the new code takes the id after the model's rows,
    its row zul_Latn's; the export's NllbTokenizer takes it as a source code at that id."""
    run, out = tmp_path / 'run', tmp_path / 'hf'
    message = convert_cli(
        f'--from_hf={fairseq_hf_dirs / "nllb"}',
        f'--workdir={run}',
        '--add_tokens=abc_Latn=zul_Latn',
    )
    assert message is None, message
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={run}', f'--out={out}'])
    assert info.value.code is None, info.value.code
    rows = json.loads((fairseq_hf_dirs / 'nllb' / 'config.json').read_text())['vocab_size']
    tokenizer = transformers.NllbTokenizer.from_pretrained(out, src_lang='abc_Latn')
    code = tokenizer.convert_tokens_to_ids('abc_Latn')
    assert code == rows and tokenizer('A dog.')['input_ids'][0] == code
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(out)
    table = model.model.shared.weight.detach().numpy()
    assert table.shape[0] == rows + 1
    np.testing.assert_array_equal(table[code], table[tokenizer.convert_tokens_to_ids('zul_Latn')])
