"""transformer.convert of T5: tiny ``T5ForConditionalGeneration`` models built by transformers
with every weight drawn (tests/t5_dirs.py: T5 v1.1's layout with a head of its own and d_kv
unlike d_model / heads, v1.0's tied ReLU, v1.1 in sharded safetensors beside tokenizer.json
alone) become run directories that give Hugging Face's log-probabilities and greedy outputs,
start fine-tuning from their weights and export back to the same tensors and files."""

import dataclasses
import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.cli import convert_cli
from tests.shared_dirs import built_once
from tests.t5_dirs import NAMES, eos_scaled, hf_eos_scaled, hf_model, lines
from tests.tiny_run import DECODE_BATCH
from transformer import interop
from transformer.checkpoint import load_model
from transformer.decoding import DecodeOptions, greedy_search
from transformer.interop.t5_vocab import T5Vocabulary

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))
STEPS = 12  # greedy tokens compared
BEAM_STEPS = 16  # beam search's limit, in tokens


def test_t5_directories_are_recognised_by_the_t5_family_alone(t5_hf_dirs):
    for name in NAMES:
        directory = str(t5_hf_dirs / name)
        assert [f.name for f in interop.FAMILIES if f.recognises(directory)] == ['t5']
        assert [f.name for f in interop.FAMILIES if f.holds_vocabulary(directory)] == ['t5']


@pytest.mark.parametrize('name', NAMES)
def test_the_run_records_t5s_settings_and_ids(t5_hf_dirs, t5_runs, name):
    config = json.loads((t5_runs / name / 'config.json').read_text())
    assert json.loads((t5_runs / name / 'converted_from.json').read_text())['family'] == 't5'
    data, model = config['data'], config['model']
    assert (data['pad_id'], data['eos_id'], data['unk_id'], data['decoder_start_id']) == (
        0,
        1,
        2,
        0,
    )
    assert (
        data['vocab_size']
        == json.loads((t5_hf_dirs / name / 'config.json').read_text())['vocab_size']
    )
    tied = name == 'v1.0'
    assert model['share_embeddings'] == ('all' if tied else 'inputs')
    assert model['rescale_tied_head'] is tied
    assert model['ffn'] == ('relu' if tied else 'geglu_tanh')
    assert (model['head_dim'], model['num_decoder_layers'], model['positions']) == (
        6,
        3,
        't5_relative',
    )


def _batch(tokenizer):
    pairs = list(zip(lines(5, seed=3), lines(5, seed=4), strict=True))
    batch = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True)
    return np.array(batch['input_ids']), np.array(batch['labels'])


@pytest.mark.slow  # transformers' models are loaded
@pytest.mark.parametrize('name', NAMES)
def test_teacher_forced_log_probs_and_greedy_outputs_equal_hugging_faces(t5_hf_dirs, t5_runs, name):
    """The run's vocabulary gives T5Tokenizer's ids; its model Hugging Face's teacher-forced
    log-probabilities to 1e-4 on a right-padded batch (float32 products), and its greedy
    search ``generate(num_beams=1)``'s tokens."""
    theirs = hf_model(t5_hf_dirs / name)
    tokenizer = transformers.T5Tokenizer.from_pretrained(str(t5_hf_dirs / 'v1.1'))
    inputs, labels = _batch(tokenizer)
    config, vocab, model, params, _ = load_model(str(t5_runs / name))
    assert [[*vocab.encode(s), 1] for s in lines(5, seed=3)] == [
        [i for i in row if i != 0] for row in inputs.tolist()
    ]
    with torch.no_grad():
        logits = theirs(
            input_ids=torch.as_tensor(inputs),
            attention_mask=torch.as_tensor(inputs != 0).long(),
            labels=torch.as_tensor(np.where(labels == 0, -100, labels)),
        ).logits
    want = torch.log_softmax(logits, -1).numpy()
    with jax.default_matmul_precision('float32'):
        ours = jax.jit(model.apply)(  # one program: eagerly, each operation compiles
            {'params': params}, jnp.asarray(inputs), jnp.asarray(labels)
        )
    ours = np.asarray(jax.nn.log_softmax(ours, -1))
    real = labels != 0
    assert (inputs == 0).any() and np.abs(want[real]).max() > 1
    np.testing.assert_allclose(ours[real], want[real], atol=1e-4, rtol=0)
    with torch.no_grad():
        out = theirs.generate(
            input_ids=torch.as_tensor(inputs),
            attention_mask=torch.as_tensor(inputs != 0).long(),
            num_beams=1,
            do_sample=False,
            max_new_tokens=STEPS,
            bad_words_ids=[[0]],  # pad, which our searches never emit
            use_cache=False,  # transformers 5's cache has num_layers (2) of the decoder's 3
        )
    want = out.numpy()[:, 1:]
    options = DecodeOptions(extra_length=STEPS, max_decode_len=STEPS, eos_at_limit='none')
    with jax.default_matmul_precision('float32'):
        mine = np.asarray(greedy_search(model, params, jnp.asarray(inputs), options=options))
    assert len(np.unique(want)) >= 4  # not one token over and over
    width = max(mine.shape[1], want.shape[1])
    mine, want = (np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in (mine, want))
    np.testing.assert_array_equal(mine, want)


def _cut(row) -> list[int]:
    """A row's ids to its first </s> (1), the padding after it left out."""
    row = [int(i) for i in row if i != 0]
    return row[: row.index(1) + 1] if 1 in row else row


def _generate_beam_4(model, inputs, **flags):
    """generate(num_beams=4)'s best outputs (cut at </s>) and their ``sequences_scores``."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.as_tensor(inputs).long(),
            attention_mask=torch.as_tensor(inputs != 0).long(),
            num_beams=4,
            do_sample=False,
            max_new_tokens=BEAM_STEPS,
            bad_words_ids=[[0]],  # pad, which our searches never emit
            use_cache=False,  # (the greedy test's reason)
            output_scores=True,
            return_dict_in_generate=True,
            **flags,
        )
    return [_cut(row[1:]) for row in out.sequences.numpy()], out.sequences_scores.numpy()


@pytest.mark.slow  # transformers' model loaded, a beam search compiled
@pytest.mark.parametrize('name', ['v1.1', pytest.param('v1.0', marks=pytest.mark.long)])
def test_beam_4_equals_generates_but_where_generate_stops_early(t5_hf_dirs, t5_runs, name):
    """Beam 4 with the run's own settings (generate's defaults, recorded by the conversion:
    log P / length^1.0, an output at the limit ending there, scores not renormalised) on 8
    lines, limited to 16 tokens, against ``generate(num_beams=4)``:

    * with ``early_stopping='never'`` (generate's exact stopping rule, ours: an example ends
      when no live hypothesis can still win at any length up to the limit): its outputs and
      ``sequences_scores`` (to 1e-5) on every line;
    * with the directory's default (``early_stopping`` false: generate ends an example once
      its best live hypothesis's log P / current length is below its K finished ones', though
      a longer continuation may still score higher, docs/pretrained.md): the same, or on a
      line where it stops early (2 of these 8 with v1.1, 1 with v1.0) an output of ours with
      a higher score.

    </s>'s output row is scaled on both sides (tests/t5_dirs.py `EOS_SCALE`) so that outputs
    end at different lengths. v1.0's in the long tier: the v1.1 case runs the same search,
    and v1.0's network (the tied rescaled head, ReLU) is checked by
    test_teacher_forced_log_probs_and_greedy_outputs_equal_hugging_faces."""
    from transformer import api, decoding

    theirs = hf_eos_scaled(hf_model(t5_hf_dirs / name), name)
    assert not theirs.generation_config.early_stopping
    run = api.load(str(t5_runs / name), devices=jax.devices()[:1])  # its parameters read alone
    ev = run.config.eval
    settings = (ev.alpha, ev.length_penalty, ev.eos_at_limit, ev.renormalize)
    assert settings == (1.0, 'fairseq', 'none', False)
    rows = [[*run.tokenizer.encode(line), 1] for line in lines(20, seed=5)[12:]]
    inputs = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        inputs[i, : len(row)] = row
    options = decoding.decode_options(ev)
    options = dataclasses.replace(options, extra_length=BEAM_STEPS, max_decode_len=BEAM_STEPS)
    params = eos_scaled(run.params, name)
    with jax.default_matmul_precision('float32'):
        sequences, scores = decoding.beam_search(
            run.model, params, inputs, beam_size=4, options=options
        )
    ours, mine = [_cut(row) for row in np.asarray(sequences)[:, 0]], np.asarray(scores)[:, 0]
    assert 0 < sum(row[-1] == 1 for row in ours) < len(rows)

    exact, exact_scores = _generate_beam_4(theirs, inputs, early_stopping='never')
    assert ours == exact
    np.testing.assert_allclose(mine, exact_scores, atol=1e-5, rtol=0)
    want, hf = _generate_beam_4(theirs, inputs)
    same = np.array([a == b for a, b in zip(ours, want, strict=True)])
    np.testing.assert_allclose(mine[same], hf[same], atol=1e-5, rtol=0)
    assert len(rows) // 2 <= same.sum() < len(rows)  # both cases seen
    assert (mine[~same] > hf[~same] + 1e-5).all()


def test_sharded_safetensors_convert_as_one_file(t5_runs):
    """v1.1 in two shards beside tokenizer.json alone: the same parameters as in one file
    beside spiece.model, and the same vocabulary's ids."""
    *_, one, _ = load_model(str(t5_runs / 'v1.1'), scan_layers=False)
    _, vocab, _, sharded, _ = load_model(str(t5_runs / 'v1.1_sharded'), scan_layers=False)
    flat = jax.tree_util.tree_leaves_with_path
    assert [p for p, _ in flat(one)] == [p for p, _ in flat(sharded)]
    for (path, a), (_, b) in zip(flat(one), flat(sharded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
    assert isinstance(vocab, T5Vocabulary) and vocab.vocab_size == 152


def _edited(t5_hf_dirs, tmp_path, name, **changes):
    directory = tmp_path / name
    shutil.copytree(t5_hf_dirs / name, directory)
    config = json.loads((directory / 'config.json').read_text())
    config.update(changes)
    (directory / 'config.json').write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ('changes', 'said'),
    [
        (dict(dtype='float16'), 'T5 overflows in float16'),
        (dict(vocab_size=500), 'vocab_size=500 is more than'),
        (dict(vocab_size=40), 'fewer than the 48 pieces'),
        (dict(feed_forward_proj='gated-relu6'), 'feed_forward_proj'),
        (dict(decoder_start_token_id=1), "decoder_start_token_id=1 is not T5's 0"),
    ],
)
def test_bad_directories_stop_in_one_line_before_anything_is_written(
    t5_hf_dirs, tmp_path, changes, said
):
    directory = _edited(t5_hf_dirs, tmp_path, 'v1.0', **changes)
    message = convert_cli(f'--from_hf={directory}', f'--workdir={tmp_path / "run"}')
    assert said in message and '\n' not in message, message
    assert not (tmp_path / 'run').exists()


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """A folder dataset of a few lines of the test vocabulary's words: 40 to train on, 8 to
    validate and test."""

    def write(path):
        path.mkdir()
        for split, n in (('train', 40), ('validation', 8), ('test', 8)):
            (path / f'{split}.en').write_text(''.join(s + '\n' for s in lines(n, seed=5)))
            (path / f'{split}.de').write_text(''.join(t + '\n' for t in lines(n, seed=6)))

    return str(built_once(tmp_path_factory, 't5-lines', write))


@pytest.mark.slow  # one step of training
def test_init_from_the_directory_starts_from_the_converted_weights(
    t5_hf_dirs, t5_runs, folder, tmp_path
):
    """``train.init_from`` of T5 v1.1's directory: the run keeps its vocabulary and ids, and
    the first step's NLL (no dropout, no smoothing) is the converted model's teacher-forced
    NLL of that batch."""
    from tests.tiny_run import tiny_run_config
    from transformer import data, schema
    from transformer.training import steps, train_and_evaluate

    config = tiny_run_config(1)
    config.data.update(dataset='folder', folder=folder)
    config.model.dropout_rate = 0.0
    config.train.update(label_smoothing=0.0, batch_size=8, init_from=str(t5_hf_dirs / 'v1.1'))
    config.opt.update(schedule='constant', lr_scale=1e-3)
    seen, run = [], tmp_path / 'run'
    # One device: the first step's NLL does not depend on how many share the batch, and one
    # device's programs compile faster than the 8 host devices' (tests/compiles.py).
    train_and_evaluate(
        config, str(run), devices=jax.devices()[:1], on_step=lambda s, m: seen.append(m)
    )
    recorded = json.loads((run / 'config.json').read_text())
    assert (recorded['data']['vocab_size'], recorded['model']['ffn']) == (152, 'geglu_tanh')
    assert interop.held_vocabulary(str(run / 'vocab')).name == 't5'
    _, _, model, params, _ = load_model(str(t5_runs / 'v1.1'), scan_layers=False)
    vocab = T5Vocabulary(t5_hf_dirs / 'v1.1')
    typed = schema.parse(schema.complete(config))
    batch = next(data.make_train_iterator(typed.data, vocab, batch_size=8, seed=0))
    with jax.default_matmul_precision('float32'):
        # One program: eagerly, each operation compiles on its own.
        evaluate = functools.partial(steps.eval_step, model=model, label_smoothing=0.0)
        sums = jax.jit(evaluate)(params, batch)
    converted_nll = float(sums['nll']) / float(sums['tokens'])
    assert seen[0]['nll'] == pytest.approx(converted_nll, rel=1e-4)
    assert converted_nll > 1.0  # a model's loss, not an empty batch's


@pytest.mark.slow  # a search compiles
def test_source_tag_puts_a_madlad_tag_first_when_translating(t5_hf_dirs, t5_runs):
    """``source_tag='<2de>'`` on a converted run: the outputs are the greedy search's of
    T5Tokenizer's ids of ``'<2de> ' + line``."""
    from transformer import api, decoding
    from transformer.data import bucket_length
    from transformer.decoding import greedy_search, translation

    run = api.load(str(t5_runs / 'v1.0'), devices=jax.devices()[:1])
    texts = lines(3, seed=9)
    tokenizer = transformers.T5Tokenizer.from_pretrained(str(t5_hf_dirs / 'v1.0'))
    ids = np.array(tokenizer([f'<2de> {t}' for t in texts], padding=True).input_ids)
    assert (ids[:, 0] == 3).all()
    # One device (its programs compile faster than 8's: tests/compiles.py), and T5Tokenizer's
    # ids in a batch of translate's shape (its rows, filler rows a lone </s>, its bucketed
    # width, pad 0 after each line) decoded on the run's mesh as translate decodes: the
    # search translate compiled runs them, where a batch of their own shape compiles another.
    inputs = np.zeros(
        (translation.batch_rows(len(texts), DECODE_BATCH), bucket_length(ids.shape[1])), np.int32
    )
    inputs[len(texts) :, 0] = 1
    inputs[: len(texts), : ids.shape[1]] = ids
    options = decoding.decode_options(run.config.eval)
    with jax.default_matmul_precision('float32'):
        tagged = run.translate(texts, beam_size=1, source_tag='<2de>', batch_size=DECODE_BATCH)
        plain = run.translate(texts, beam_size=1, batch_size=DECODE_BATCH)
        ids = decoding.decode(
            greedy_search, run.model, run.params, inputs, run.layout, options=options
        )
    assert tagged == [run.tokenizer.decode(row) for row in ids[: len(texts)]]
    assert tagged != plain


@pytest.mark.parametrize(
    ('keys', 'ffn', 'share', 'rescale'),
    [
        ({}, 'relu', 'all', True),  # t5-small's config: transformers' defaults
        (
            dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False),
            'geglu_tanh',
            'inputs',
            False,
        ),
        (
            dict(feed_forward_proj='gated-silu', scale_decoder_outputs=False),
            'swiglu',
            'inputs',
            False,
        ),
        (dict(feed_forward_proj='gelu', tie_word_embeddings=True), 'gelu', 'all', True),
    ],
)
def test_config_keys_map_onto_the_model_section(keys, ffn, share, rescale):
    from transformer.interop.t5 import model_settings

    model = model_settings({'model_type': 't5', **keys}, 'config.json')
    assert (model['ffn'], model['share_embeddings'], model['rescale_tied_head']) == (
        ffn,
        share,
        rescale,
    )
    assert (model['head_dim'], model['num_decoder_layers'], model['layer_norm_epsilon']) == (
        64,
        6,
        1e-6,
    )
