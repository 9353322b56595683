"""The CTranslate2 export written directly (transformer/commands/ctranslate2_spec.py): for
models of every option CTranslate2 holds, built here with random parameters, CTranslate2's
scores of fixed target sequences are our model's log-probabilities. CTranslate2 runs only in
processes of its own (tests/ctranslate2_child.py); this process never imports it."""

import json
import os

import jax
import numpy as np
import pytest

from tests import ctranslate2_child
from tests.random_params import fill_random
from tests.tiny_run import tiny_run_config
from transformer import export, schema
from transformer.commands import ctranslate2_spec
from transformer.model import (
    Transformer,
    TransformerConfig,
    abstract_params,
    export_refusal,
    teacher_forced_logits,
)
from transformer.tokens import EOS_ID

pytest.importorskip(
    'ctranslate2', reason="ctranslate2 is not installed: pip install -e '.[export]'"
)

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=8)  # N * H = 32, not d_model = 16
# Each case: TransformerConfig fields over the tiny model's. The first is the paper's model.
CASES = {
    'paper': {},
    'pre_ln_separate_gqa_biases': dict(
        pre_layer_norm=True,
        share_embeddings='none',
        attention_bias=True,
        logits_bias=True,
        ffn='gelu',
        **GQA,
    ),
    'target_embeddings_swish': dict(
        share_embeddings='target', ffn='swish', layer_norm_epsilon=1e-5
    ),
    'rope': dict(positions='rope', **GQA),
    'rms_norm': dict(norm='rms_norm', pre_layer_norm=True),
    'rms_norm_post_ln': dict(norm='rms_norm'),
    'swiglu': dict(ffn='swiglu'),
    'geglu': dict(ffn='geglu', pre_layer_norm=True),
    # QK-norm with one head: CTranslate2 norms the cross-attention's queries of all heads
    # together (test_qk_norm_of_several_heads_is_refused), the same with one head.
    'qk_norm_one_head': dict(qk_norm=True, attention_bias=True, num_heads=1),
    'qk_norm_rope_rms_geglu': dict(
        qk_norm=True,
        num_heads=1,
        positions='rope',
        norm='rms_norm',
        pre_layer_norm=True,
        ffn='geglu',
    ),
    'modern': dict(
        positions='rope',
        norm='rms_norm',
        ffn='swiglu',
        pre_layer_norm=True,
        share_embeddings='none',
        **GQA,
    ),
    # fairseq's models' options (M2M100's sinusoids from the pad id + 1, here 0 + 1; mBART's
    # learned table, embedding norm, unscaled embeddings), with this vocabulary's ids.
    'm2m100_options': dict(
        positions='fairseq_sinusoidal', pre_layer_norm=True, attention_bias=True, ffn='relu'
    ),
    'mbart_options': dict(
        positions='bart_learned',
        max_positions=16,
        layernorm_embedding=True,
        scale_embedding=False,
        logits_bias=True,
        pre_layer_norm=True,
        attention_bias=True,
        ffn='gelu',
    ),
}


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
    from transformer.data.tokenizer import train_tokenizer

    sentences = ['the cat sat on the mat .', 'a dog ran in the park !', 'zebras jump boxes'] * 4
    path = tmp_path_factory.mktemp('spm') / 'spm.model'
    return train_tokenizer(sentences, str(path), vocab_size=40)


def _config(tokenizer, **overrides) -> TransformerConfig:
    base = dict(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        attention_impl='einsum',
    )
    return TransformerConfig(**(base | overrides))


def _batch():
    """Sources [2, 7] (EOS, then padding in the second) and targets [2, 6] (padding)."""
    rng = np.random.default_rng(0)
    inputs = rng.integers(3, 40, (2, 7)).astype(np.int32)
    inputs[0, 6], inputs[1, 4], inputs[1, 5:] = EOS_ID, EOS_ID, 0
    targets = rng.integers(3, 40, (2, 6)).astype(np.int32)
    targets[1, 4:] = 0
    return inputs, targets


@pytest.mark.slow
@pytest.mark.parametrize('case', list(CASES))
def test_scores_are_our_log_probs(case, tokenizer, tmp_path):
    """CTranslate2's score_batch of each target token (and of the </s> it appends) is our
    teacher-forced log-softmax, to 1e-4 (float32), on sequences of different lengths."""
    cfg = _config(tokenizer, **CASES[case])
    assert export_refusal(cfg, ctranslate2_spec.WRITES) is None
    model = Transformer(cfg)
    params = fill_random(abstract_params(model), logits_scale=3.0)
    if cfg.logits_bias:
        params['logits_bias'] *= 10  # std 1: the bias moves the predictions
    directory = ctranslate2_spec.write_ctranslate2(
        str(tmp_path), cfg, schema.parse(tiny_run_config(1)), tokenizer, params
    )
    assert sorted(os.listdir(directory)) == [
        'config.json',
        'model.bin',
        'shared_vocabulary.json',
        'source.spm',
        'target.spm',
    ]
    config = json.loads(open(os.path.join(directory, 'config.json')).read())
    assert config['layer_norm_epsilon'] == cfg.layer_norm_epsilon
    assert config['decoder_start_token'] == '<pad>' and config['unk_token'] == '<unk>'

    inputs, targets = _batch()
    lengths = (targets != 0).sum(1)
    with_eos = np.pad(targets, ((0, 0), (0, 1)))
    with_eos[np.arange(2), lengths] = EOS_ID
    logits = jax.jit(teacher_forced_logits, static_argnums=0)(model, params, inputs, with_eos)
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    pieces = lambda ids: [tokenizer.id_to_piece(int(i)) for i in ids if i]  # noqa: E731
    scored = ctranslate2_child.score(
        directory, [pieces(row) for row in inputs], [pieces(row) for row in targets]
    )
    for row, result in enumerate(scored):
        n = lengths[row] + 1  # the targets and </s>
        assert len(result) == n
        want = log_probs[row, np.arange(n), with_eos[row, :n]]
        np.testing.assert_allclose(result, want, atol=1e-4, err_msg=case)
    assert np.ptp(log_probs, axis=-1).max() > 3  # distributions far from uniform


def test_weights_are_named_as_the_spec_and_ours_laid_out():
    """The fused self-attention matrix is q, k, v's [out, in] rows, a head's H rows together;
    cross-attention's second linear is k and v; the gated FFN's gate is linear_0; our
    interleaved sinusoids are the table (no permutation), with the rows asked for."""
    cfg = TransformerConfig(
        vocab_size=11, d_model=8, num_heads=2, d_ff=6, num_encoder_layers=1,
        num_decoder_layers=1, ffn='swiglu', attention_bias=True, num_kv_heads=1,
    )  # fmt: skip
    params = jax.tree.map(np.float32, fill_random(abstract_params(Transformer(cfg))))
    weights = ctranslate2_spec.spec_weights(params, cfg, 30)
    attention = params['decoder_layer_0']['self_attention']
    fused = weights['decoder/layer_0/self_attention/linear_0/weight']
    assert fused.shape == (8 + 2 * 4, 8)  # N*H + 2*K*H rows
    np.testing.assert_array_equal(fused[4:8], attention['query']['kernel'][:, 1, :].T)
    np.testing.assert_array_equal(fused[8:12], attention['key']['kernel'][:, 0, :].T)
    bias = weights['decoder/layer_0/self_attention/linear_0/bias']
    np.testing.assert_array_equal(bias[12:], attention['value']['bias'][0])
    cross = params['decoder_layer_0']['cross_attention']
    kv = weights['decoder/layer_0/attention/linear_1/weight']
    np.testing.assert_array_equal(kv[4:], cross['value']['kernel'][:, 0, :].T)
    out = weights['decoder/layer_0/attention/linear_2/weight']
    np.testing.assert_array_equal(out[:, 4:], cross['out']['kernel'][1].T)
    ffn = params['encoder_layer_0']['ffn']
    np.testing.assert_array_equal(
        weights['encoder/layer_0/ffn/linear_0/weight'], ffn['wi_0']['kernel'].T
    )
    np.testing.assert_array_equal(
        weights['encoder/layer_0/ffn/linear_0_noact/weight'], ffn['wi_1']['kernel'].T
    )
    table = weights['encoder/position_encodings/encodings']
    assert table.shape == (30, 8)
    np.testing.assert_allclose(table[3, :2], [np.sin(3.0), np.cos(3.0)], atol=1e-6)
    shared = params['shared_embedding']['embedding']
    for name in ('encoder/embeddings_0', 'decoder/embeddings', 'decoder/projection'):
        np.testing.assert_array_equal(weights[f'{name}/weight'], shared)
    assert 'decoder/projection/bias' not in weights
    options = ctranslate2_spec.spec_options(cfg)['decoder']
    assert options['num_heads_kv'] == 1 and options['head_dim'] is None
    assert options['ffn_glu'] and options['activation'] == 'SWISH'


def test_refused_and_failed_exports_write_nothing(tokenizer, tmp_path, monkeypatch):
    """A refused run (its config alone) and a child that fails: one line, and neither --out
    nor a staging directory left."""
    config = tiny_run_config(1)
    config.data.pretokenize = 'moses'
    with pytest.raises(export.ExportError, match='data.pretokenize') as info:
        export.check_expressible(schema.parse(config), 'ctranslate2')
    assert '\n' not in str(info.value)

    cfg = _config(tokenizer)
    params = fill_random(abstract_params(Transformer(cfg)))
    real = ctranslate2_spec.spec_weights

    def extra(*args):
        return {**real(*args), 'decoder/layer_0/ffn/linear_9/weight': np.zeros((2, 2), np.float32)}

    monkeypatch.setattr(ctranslate2_spec, 'spec_weights', extra)
    staging = tmp_path / 'staging'
    staging.mkdir()
    with pytest.raises(export.ExportError) as info:
        ctranslate2_spec.write_ctranslate2(
            str(staging), cfg, schema.parse(tiny_run_config(1)), tokenizer, params
        )
    message = str(info.value)
    assert message.startswith('The CTranslate2 export failed: ') and '\n' not in message
    assert 'linear_9' in message
    assert not (staging / 'ctranslate2').exists()


def test_qk_norm_of_several_heads_is_refused(tokenizer):
    """CTranslate2 norms cross-attention's queries of all heads together: QK-norm with two
    heads is refused from the config, in one line; with one head it exports (above)."""
    config = tiny_run_config(1)
    config.model.update(dict(d_model=16, num_heads=2, qk_norm=True))
    with pytest.raises(export.ExportError, match='model.qk_norm=True') as info:
        export.check_expressible(schema.parse(config), 'ctranslate2')
    assert '\n' not in str(info.value) and 'num_heads=2' in str(info.value)
    config.model.num_heads = 1
    export.check_expressible(schema.parse(config), 'ctranslate2')
