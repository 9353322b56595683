"""transformer.export: the MarianMT and CTranslate2 exports compute what our model computes."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import ctranslate2_child
from tests.shared_dirs import built_once
from transformer import data as data_lib
from transformer import export
from transformer.checkpoint import load_model
from transformer.commands import ctranslate2_spec
from transformer.commands import train as trainer
from transformer.decoding import decode_options, translation
from transformer.interop import marian_export, marian_params
from transformer.model import sinusoidal_positions
from transformer.tokens import EOS_ID

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))
pytest.importorskip('ctranslate2', reason=_SKIP.format('ctranslate2'))
pytest.importorskip('safetensors', reason=_SKIP.format('safetensors'))
MarianMTModel, MarianTokenizer = transformers.MarianMTModel, transformers.MarianTokenizer

NUM_TEST = 120


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """A tiny synthetic run trained until greedy translations are real sentences (~30 s),
    once for all workers."""
    from tests.tiny_run import tiny_run_config

    def train(workdir):
        config = tiny_run_config(300)
        config.model.dropout_rate = 0.0
        config.opt.warmup_steps = 100
        config.train.batch_size = 32
        config.train.checkpoint_every = 100
        config.train.log_every = 100
        config.data.vocab_size = 1000  # every word of the pair: no <unk> in the outputs
        config.data.synthetic.num_train = 3000
        config.data.synthetic.num_test = NUM_TEST
        # One device: the 8 host devices' data-parallel step costs more on a CPU's few cores
        # (300 steps: 28 s of CPU against 21 s on 2 cores).
        trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:1])

    return built_once(tmp_path_factory, 'export_run', train)


@pytest.fixture(scope='module')
def loaded(run_dir):
    return load_model(str(run_dir))


@pytest.fixture(scope='module')
def hf_dir(run_dir, tmp_path_factory):
    return built_once(tmp_path_factory, 'export_hf', lambda out: _export(run_dir, out))


@pytest.fixture(scope='module')
def ct2_dir(run_dir, tmp_path_factory):
    def ct2(out):
        _export(run_dir, out, '--format=ctranslate2')

    return built_once(tmp_path_factory, 'export_ct2', ct2)


def _export(run_dir, out, *args) -> None:
    message = _cli(f'--workdir={run_dir}', f'--out={out}', *args)
    assert message is None, message


def _cli(*args):
    """Runs the export command in-process; returns its exit message (None on success)."""
    with pytest.raises(SystemExit) as info:
        export.cli(['export', *args])
    return info.value.code


def _test_sentences(config):
    sources, _ = data_lib.load_text(config.data, config.data.test_split)
    return sources[:NUM_TEST]


def test_marian_channel_order_turns_our_sinusoids_into_marians():
    """Our interleaved table, channels permuted, is Hugging Face Marian's sin | cos table."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    d_model, positions = 16, 40
    theirs = MarianSinusoidalPositionalEmbedding(positions, d_model).create_weight().numpy()
    ours = np.asarray(sinusoidal_positions(jnp.arange(positions), d_model))
    perm = marian_params.marian_channel_order(d_model)
    np.testing.assert_allclose(ours[:, perm], theirs, atol=2e-5)
    assert np.abs(ours - theirs).max() > 0.5  # unpermuted, they are different tables


@pytest.mark.slow
def test_teacher_forced_logits_equal_ours(loaded, hf_dir):
    """Logits of the exported MarianMT equal ours on a padded batch: to 1e-4 with our layer
    norm epsilon, and close with Marian's hard-coded 1e-5 (the README's measured figure)."""
    config, tokenizer, model, params, _ = loaded
    sources, references = data_lib.load_text(config.data, config.data.test_split)
    inputs = data_lib.batch_examples(
        [np.array([*tokenizer.encode(s), EOS_ID], np.int32) for s in sources[:24]], None, 24
    )[0]['inputs']
    targets = np.zeros((len(inputs), 40), np.int32)
    for row, text in enumerate(references[:24]):
        ids = [*tokenizer.encode(text), EOS_ID][:40]
        targets[row, : len(ids)] = ids
    assert (inputs == 0).any() and (targets == 0).any()  # the batch has padding
    apply = jax.jit(model.apply)  # one program: eagerly, each operation compiles on its own
    ours = np.asarray(apply({'params': params}, jnp.asarray(inputs), jnp.asarray(targets)))

    hf = MarianMTModel.from_pretrained(hf_dir).eval()

    def hf_logits():
        with torch.no_grad():
            return hf(
                input_ids=torch.as_tensor(inputs, dtype=torch.long),
                attention_mask=torch.as_tensor(inputs != 0),
                decoder_input_ids=torch.as_tensor(np.pad(targets, ((0, 0), (1, 0)))[:, :-1]),
            ).logits.numpy()

    valid = targets != 0
    marian_eps = np.abs(hf_logits() - ours)[valid].max()
    for module in hf.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = model.config.layer_norm_epsilon
    same_eps = np.abs(hf_logits() - ours)[valid].max()
    eps = model.config.layer_norm_epsilon
    print(f'max |logit difference|: {same_eps:.2e} (eps {eps}), {marian_eps:.2e} (eps 1e-5)')
    assert same_eps < 1e-4
    assert marian_eps < 5e-4
    assert np.abs(ours[valid]).max() > 5  # not a model whose logits are all near zero


def _until_eos(tokens):
    tokens = [int(t) for t in tokens if t != 0]
    return tokens[: tokens.index(EOS_ID) + 1] if EOS_ID in tokens else tokens


def _with_our_length_limits(translate_rows, source_ids, extra_length, own_limit):
    """``translate_rows(rows, limit)`` for every sentence, first with the export's own fixed
    limit (limit=None: ``own_limit`` tokens), then again, grouped by limit, for those that reach
    it or ours: input length + ``extra_length`` tokens, EOS included and forced at the last one
    (Sec. 6.1), a limit per sentence that the exports' configurations cannot express."""
    limits = [len(ids) + extra_length for ids in source_ids]
    out = translate_rows(list(range(len(source_ids))), None)
    long = [
        i for i, t in enumerate(out) if len(t) >= min(limits[i], own_limit) or t[-1:] != [EOS_ID]
    ]
    for limit in sorted({limits[i] for i in long}):
        rows = [i for i in long if limits[i] == limit]
        for i, tokens in zip(rows, translate_rows(rows, limit), strict=True):
            out[i] = tokens
    return out, len(long)


@pytest.mark.slow
def test_greedy_translations_are_identical_ours_hf_ctranslate2(loaded, hf_dir, ct2_dir):
    """Greedy translations of 120 test sentences: ours (the translate command's path), the
    Hugging Face export's generate() and CTranslate2 float32 give the same text, token for
    token, including the few that only end at our length limit."""
    config, tokenizer, model, params, _ = loaded
    sentences = _test_sentences(config)
    extra = config.eval.extra_length
    ours = translation.translate_lines(
        sentences,
        tokenizer,
        model,
        params,
        beam_size=1,
        options=decode_options(config.eval),
        # One batch, so one search is compiled: batches of 64 hold two bucketed lengths, two
        # programs (9.5 s of CPU against 4.6 s on 2 cores).
        batch_size=NUM_TEST,
        max_input_tokens=1000,  # whole lines, as the exports read them
    )
    hf_tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    source_ids = hf_tokenizer(sentences)['input_ids']
    hf = MarianMTModel.from_pretrained(hf_dir).eval()

    def hf_rows(rows, limit):
        batch = hf_tokenizer([sentences[i] for i in rows], return_tensors='pt', padding=True)
        lengths = {} if limit is None else {'max_length': limit + 1}  # + the start token
        with torch.no_grad():
            out = hf.generate(**batch, num_beams=1, do_sample=False, **lengths)
        return [_until_eos(row[1:].tolist()) for row in out]

    def ct2_rows(rows, limit):
        hypotheses = ctranslate2_child.translate(
            ct2_dir,
            [hf_tokenizer.convert_ids_to_tokens(source_ids[i]) for i in rows],
            beam_size=1,
            max_decoding_length=256 if limit is None else limit - 1,
            suppress_sequences=[['<pad>']],
            return_end_token=True,
        )
        tokens = [hf_tokenizer.convert_tokens_to_ids(h) for h in hypotheses]
        if limit is None:
            return tokens
        return [t if t[-1:] == [EOS_ID] else [*t, EOS_ID] for t in tokens]  # EOS at the limit

    hf_tokens, hf_long = _with_our_length_limits(
        hf_rows, source_ids, extra, hf.generation_config.max_length - 1
    )
    ct2_tokens, ct2_long = _with_our_length_limits(ct2_rows, source_ids, extra, 256)
    assert len(ours) == NUM_TEST >= 100
    assert [tokenizer.decode(t) for t in hf_tokens] == ours
    assert ct2_tokens == hf_tokens
    assert hf_tokenizer.batch_decode(hf_tokens, skip_special_tokens=True) == ours
    assert len(set(ours)) > NUM_TEST // 2 and np.mean([len(t) for t in hf_tokens]) > 5
    assert hf_long == ct2_long <= NUM_TEST - 100  # at least 100 end on their own


def test_marian_tokenizer_gives_our_ids_and_text(loaded, hf_dir):
    """MarianTokenizer on the export encodes to our ids (EOS appended, unknown words -> our
    <unk>) and decodes our ids to our text."""
    config, tokenizer, *_ = loaded
    hf_tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    sentences = [*_test_sentences(config), 'ze qwxyzzy pud .']
    ours = [[*tokenizer.encode(s), EOS_ID] for s in sentences]
    assert hf_tokenizer(sentences)['input_ids'] == ours
    assert 2 in ours[-1]  # the made-up word is our <unk>
    assert hf_tokenizer.pad_token_id == 0 and hf_tokenizer.eos_token_id == EOS_ID
    texts = hf_tokenizer.batch_decode(ours[:-1], skip_special_tokens=True)
    assert texts == [tokenizer.decode(ids) for ids in ours[:-1]]


def test_ctranslate2_int8_is_smaller_and_translates_alike(run_dir, ct2_dir, tmp_path, loaded):
    """--quantization int8 writes int8 weights (a smaller model.bin; the float32 sinusoid
    tables it keeps are most of this tiny model) whose greedy outputs mostly agree with
    float32's."""
    import sentencepiece as spm

    out = tmp_path / 'int8'
    assert not _cli(f'--workdir={run_dir}', f'--out={out}', '--format=ctranslate2',
                    '--quantization=int8')  # fmt: skip
    assert (out / 'model.bin').stat().st_size < 0.7 * (ct2_dir / 'model.bin').stat().st_size
    sp = spm.SentencePieceProcessor(model_file=str(out / 'source.spm'))
    batch = [[*sp.encode(s, out_type=str), '</s>'] for s in _test_sentences(loaded[0])]
    results = {}
    for name, directory in (('float32', ct2_dir), ('int8', out)):
        hypotheses = ctranslate2_child.translate(
            directory, batch, compute_type='auto', beam_size=1, suppress_sequences=[['<pad>']]
        )
        results[name] = [sp.decode(h) for h in hypotheses]
    same = sum(a == b for a, b in zip(results['float32'], results['int8'], strict=True))
    assert same >= 0.8 * NUM_TEST


@pytest.mark.parametrize(
    'ffn, embeddings', [('swish', 'all'), ('gelu', 'all'), ('swish', 'target')]
)
def test_marian_options_export_and_compute_our_logits(ffn, embeddings, tmp_path):
    """A model of MarianMT's options, random (biases and the logits' bias non-zero), exported
    without a run: Hugging Face's MarianMTModel gives our teacher-forced logits on a padded
    batch to 1e-4 (float32, layer norm epsilon 1e-5 as Marian's), with its activation_function
    and final_logits_bias ours, and unshared source and target tables ('target':
    share_encoder_decoder_embeddings false, lm_head tied to the decoder's); the CTranslate2
    export scores each target token as we do."""
    from tests.random_params import fill_random
    from tests.tiny_run import tiny_run_config
    from transformer import schema
    from transformer.data.tokenizer import train_tokenizer
    from transformer.model import (
        Transformer,
        TransformerConfig,
        abstract_params,
        teacher_forced_logits,
    )

    sentences = ['the cat sat on the mat .', 'a dog ran in the park !', 'zebras jump boxes'] * 4
    tokenizer = train_tokenizer(sentences, str(tmp_path / 'spm.model'), vocab_size=40)
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=2,
        ffn=ffn,
        share_embeddings=embeddings,
        attention_bias=True,
        logits_bias=True,
        layer_norm_epsilon=1e-5,
        attention_impl='einsum',
    )
    model = Transformer(cfg)
    params = fill_random(abstract_params(model))
    params['logits_bias'] *= 30  # std 3: the bias moves the predictions
    hf_dir = tmp_path / 'hf'
    hf_dir.mkdir()
    run_config = schema.parse(tiny_run_config(1))
    marian_export.write_hf(str(hf_dir), cfg, run_config, tokenizer, params, length_exponent=0.0)
    rng = np.random.default_rng(0)
    inputs = rng.integers(3, cfg.vocab_size, (2, 6)).astype(np.int32)
    inputs[:, 3], inputs[1, 4:] = EOS_ID, 0
    targets = rng.integers(3, cfg.vocab_size, (2, 5)).astype(np.int32)
    targets[1, 3:] = 0
    ours = np.asarray(
        jax.jit(teacher_forced_logits, static_argnums=0)(model, params, inputs, targets)
    )

    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    assert hf.config.activation_function == ffn
    assert hf.config.share_encoder_decoder_embeddings == (embeddings == 'all')
    np.testing.assert_array_equal(hf.final_logits_bias[0].numpy(), params['logits_bias'])
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.as_tensor(inputs, dtype=torch.long),
            attention_mask=torch.as_tensor(inputs != 0),
            decoder_input_ids=torch.as_tensor(np.pad(targets, ((0, 0), (1, 0)))[:, :-1]),
        ).logits.numpy()
    valid = targets != 0
    assert np.abs(theirs - ours)[valid].max() < 1e-4
    assert np.abs(ours).max() > 3

    staging = tmp_path / 'staging'
    staging.mkdir()
    ct2_dir = ctranslate2_spec.write_ctranslate2(str(staging), cfg, run_config, tokenizer, params)
    pieces = MarianTokenizer.from_pretrained(hf_dir).convert_ids_to_tokens
    rows = lambda ids: [pieces([int(i) for i in row if i]) for row in ids]  # noqa: E731
    scored = ctranslate2_child.score(ct2_dir, rows(inputs), rows(targets))
    log_probs = np.asarray(jax.nn.log_softmax(ours))
    for row, result in enumerate(scored):  # CTranslate2 adds </s>'s score after the targets'
        n = valid[row].sum()
        want = log_probs[row, np.arange(n), targets[row, :n]]
        np.testing.assert_allclose(result[:n], want, atol=1e-4)


def test_unexportable_configs_are_one_line_errors():
    """Options MarianMT cannot express fail with one line naming the option and the fix;
    CTranslate2 holds them all."""
    from tests.tiny_run import tiny_run_config
    from transformer import schema

    def run_config(**model):
        config = tiny_run_config(1)
        config.model.update(dict(d_model=32, num_heads=4) | model)
        return schema.parse(config)

    cases = [
        (dict(pre_layer_norm=True), 'pre_layer_norm=True'),
        (dict(share_embeddings='none'), "share_embeddings='none'"),
        (dict(head_dim=16), 'head_dim=16'),
    ]
    for format in export.FORMATS:
        export.check_expressible(run_config(), format)
    for change, option in cases:
        with pytest.raises(export.ExportError, match=f'model.{option}') as info:
            export.check_expressible(run_config(**change), 'hf')
        assert '\n' not in str(info.value) and 'only' in str(info.value)
        export.check_expressible(run_config(**change), 'ctranslate2')


def test_command_errors_are_one_line_and_leave_nothing_behind(run_dir, tmp_path, monkeypatch):
    """No checkpoints, a non-empty --out, a file as --out, a pre-LN model: one `error:` line,
    --out as it was and no temporary directory left."""
    empty = tmp_path / 'no_checkpoints'
    shutil.copytree(run_dir, empty, ignore=shutil.ignore_patterns('checkpoints'))
    message = _cli(f'--workdir={empty}', f'--out={tmp_path / "a"}')
    assert message.startswith('error: No checkpoints') and '\n' not in message

    existing = tmp_path / 'existing'
    existing.mkdir()
    (existing / 'keep.txt').write_text('mine')
    for overwrite in ([], ['--overwrite']):  # --overwrite replaces an earlier export only
        message = _cli(f'--workdir={run_dir}', f'--out={existing}', *overwrite)
        assert message == (
            f'error: {existing} is not empty and holds no export of this project (no '
            'transformer_export.json): export into a new or empty directory.'
        )
    a_file = existing / 'keep.txt'  # even with --overwrite, a file is not replaced by a model
    message = _cli(f'--workdir={run_dir}', f'--out={a_file}', '--overwrite')
    assert message == f'error: {a_file} is a file; --out names the directory to export into.'
    assert os.listdir(existing) == ['keep.txt']

    # A run whose model MarianMT cannot express: its config says pre-LN. Refused from the
    # config, before the checkpoints are read (their loading would fail the test).
    pre_ln = tmp_path / 'pre_ln'
    shutil.copytree(run_dir, pre_ln)
    config = json.loads((pre_ln / 'config.json').read_text())
    config['model']['pre_layer_norm'] = True
    (pre_ln / 'config.json').write_text(json.dumps(config))

    def broken(*args, **kwargs):
        raise RuntimeError('conversion failed')

    monkeypatch.setattr(export, 'load_run', broken)
    message = _cli(f'--workdir={pre_ln}', f'--out={tmp_path / "b"}')
    assert message.startswith('error: model.pre_layer_norm=True') and '\n' not in message
    assert sorted(os.listdir(tmp_path)) == ['existing', 'no_checkpoints', 'pre_ln']


def test_overwrite_replaces_an_earlier_export_and_nothing_else(
    run_dir, hf_dir, tmp_path, monkeypatch
):
    """An export's transformer_export.json names its format, run and steps and lists its
    files: --overwrite replaces such a directory (a failure half-way leaves it whole), and
    refuses one that also holds a file of someone else's, or an export without the mark (a
    version before it, which a hub MarianMT directory cannot be told from)."""
    from tests.file_tree import tree_hashes

    mark = json.loads((hf_dir / 'transformer_export.json').read_text())
    assert mark['written_by'] == 'transformer.export' and mark['format'] == 'hf'
    assert mark['workdir'] == str(run_dir) and mark['steps'] == [300]
    assert sorted(mark['files']) == sorted(set(os.listdir(hf_dir)) - {'transformer_export.json'})
    earlier = tmp_path / 'earlier'
    shutil.copytree(hf_dir, earlier)
    before = tree_hashes(tmp_path)
    message = _cli(f'--workdir={run_dir}', f'--out={earlier}')
    assert message == (
        f'error: {earlier} holds an earlier export (hf, steps [300]); pass --overwrite to '
        'replace it.'
    )

    def broken(*args, **kwargs):
        raise RuntimeError('conversion failed')

    with monkeypatch.context() as patch:
        patch.setattr(ctranslate2_spec, 'write_ctranslate2', broken)
        with pytest.raises(RuntimeError, match='conversion failed'):
            export.export(str(run_dir), str(earlier), format='ctranslate2', overwrite=True)
    assert tree_hashes(tmp_path) == before
    assert not _cli(f'--workdir={run_dir}', f'--out={earlier}', '--overwrite', '--step=200')
    assert json.loads((earlier / 'transformer_export.json').read_text())['steps'] == [200]
    assert (earlier / 'model.safetensors').read_bytes() != (
        hf_dir / 'model.safetensors'
    ).read_bytes()
    assert sorted(os.listdir(tmp_path)) == ['earlier']

    (earlier / 'README.md').write_text('my model card')
    legacy = tmp_path / 'legacy'  # an export of a version before the mark
    shutil.copytree(hf_dir, legacy, ignore=shutil.ignore_patterns('transformer_export.json'))
    before = tree_hashes(tmp_path)
    for out, words in ((earlier, 'files that no export wrote (README.md)'),
                       (legacy, "holds a model (config.json of model_type 'marian'")):  # fmt: skip
        message = _cli(f'--workdir={run_dir}', f'--out={out}', '--overwrite')
        assert message.startswith('error: ') and words in message and '\n' not in message
    assert tree_hashes(tmp_path) == before
