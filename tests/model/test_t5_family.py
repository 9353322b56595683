"""T5 against Hugging Face's: the bucket function equals ``T5Attention._relative_position_bucket``
on every distance from -300 to 300, and tiny ``T5ForConditionalGeneration`` models built by
transformers with random weights, copied into this package's Transformer by the T5 family's
mapping (transformer/interop/t5_params.py), give the same teacher-forced logits to 1e-4 (ours in
float32, theirs in float64) on right-padded rows: T5 v1.1's layout
(gated tanh GELU, an untied head beside shared input embeddings, d_kv unlike d_model / heads)
and v1.0's (ReLU, the head tied and its input rescaled by d_model^-0.5).

The options that build T5 (transformer/model/relative_positions.py, docs/model_variants.md):
RMSNorm before each sub-layer and closing each stack, eps 1e-6; no sqrt(D) embedding scale;
unscaled logits (attention_scale 1.0); no attention biases; T5's ids, pad 0 = the decoder's
start, eos 1, unk 2 (this package's joint vocabulary's own)."""

import jax
import numpy as np
import pytest

from tests.model.cached_greedy import cached_greedy, hf_greedy
from transformer.interop.t5_params import params_from_state_dict
from transformer.model import Transformer, TransformerConfig, relative_position_buckets

pytestmark = pytest.mark.slow  # transformers' models are imported and built
torch = pytest.importorskip('torch', reason="torch is not installed: pip install -e '.[export]'")
transformers = pytest.importorskip(
    'transformers', reason="transformers is not installed: pip install -e '.[export]'"
)

V, D, D_KV, HEADS, F, LAYERS, BUCKETS, DISTANCE, PAD, EOS = 40, 16, 6, 2, 24, 2, 8, 20, 0, 1
SHAPE = dict(
    vocab_size=V,
    d_model=D,
    d_kv=D_KV,  # not D / HEADS = 8
    d_ff=F,
    num_layers=LAYERS,
    num_decoder_layers=LAYERS,
    num_heads=HEADS,
    relative_attention_num_buckets=BUCKETS,
    relative_attention_max_distance=DISTANCE,
    dropout_rate=0.0,
    layer_norm_epsilon=1e-6,
    pad_token_id=PAD,
    eos_token_id=EOS,
    decoder_start_token_id=PAD,
)
OURS = dict(
    vocab_size=V,
    d_model=D,
    head_dim=D_KV,
    num_heads=HEADS,
    d_ff=F,
    num_encoder_layers=LAYERS,
    num_decoder_layers=LAYERS,
    positions='t5_relative',
    relative_attention_num_buckets=BUCKETS,
    relative_attention_max_distance=DISTANCE,
    norm='rms_norm',
    pre_layer_norm=True,
    layer_norm_epsilon=1e-6,
    scale_embedding=False,
    attention_scale=1.0,
    dropout_rate=0.0,
    attention_impl='einsum',
)
VERSIONS = {
    'v1.1': (
        dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False),
        dict(ffn='geglu_tanh', share_embeddings='inputs'),
    ),
    'v1.0': (
        dict(feed_forward_proj='relu', tie_word_embeddings=True),
        dict(ffn='relu', share_embeddings='all', rescale_tied_head=True),
    ),
}


@pytest.mark.parametrize(('num_buckets', 'max_distance'), [(32, 128), (BUCKETS, DISTANCE)])
@pytest.mark.parametrize('bidirectional', [True, False])
def test_buckets_equal_hugging_faces_from_minus_300_to_300(
    bidirectional, num_buckets, max_distance
):
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = np.arange(-300, 301)
    want = T5Attention._relative_position_bucket(
        torch.from_numpy(distance), bidirectional, num_buckets, max_distance
    ).numpy()
    got = relative_position_buckets(
        distance, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    np.testing.assert_array_equal(np.asarray(got), want)
    assert len(np.unique(want)) >= num_buckets - 2  # every side's last bucket reached


def t5(version: str):
    """(Hugging Face's model, our config, our parameters): every weight drawn, torch seeded,
    the norms' scales from N(1, 0.2^2), the rest from N(0, 0.5^2)."""
    hf_options, our_options = VERSIONS[version]
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**SHAPE, **hf_options))
    model = model.eval()
    if not hf_options['tie_word_embeddings']:
        # transformers 5 ties T5's lm_head to the shared embedding whatever the config (its
        # tie_word_embeddings=False only turns the rescale off, scale_decoder_outputs); T5
        # v1.1 and MADLAD-400 hold a head of their own, given here.
        model.lm_head.weight = torch.nn.Parameter(torch.empty(V, D))
        assert model.lm_head.weight is not model.shared.weight
    with torch.no_grad():
        for path, tensor in model.named_parameters():
            tensor.normal_(1.0, 0.2) if 'layer_norm' in path else tensor.normal_(0.0, 0.5)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    cfg = TransformerConfig(**OURS, **our_options)
    return model, cfg, params_from_state_dict(weights, {**OURS, **our_options}, 'T5')


def _tokens(seed: int, shape: tuple[int, int], lengths) -> np.ndarray:
    """Ids in [3, V) ending with </s> (1), padded with 0 after lengths[b] (right padding)."""
    tokens = np.random.default_rng(seed).integers(3, V, shape)
    tokens[np.arange(len(lengths)), np.asarray(lengths) - 1] = EOS
    tokens[np.arange(shape[1])[None, :] >= np.asarray(lengths)[:, None]] = PAD
    return tokens.astype(np.int32)


@pytest.mark.parametrize('version', VERSIONS)
def test_teacher_forced_logits_equal_hugging_faces(version):
    """The same ids to both: the source [B, S] right-padded with 0 under its attention mask,
    rows longer than max_distance; the decoder's inputs our shifted targets (0, T5's start,
    then the targets). Every real target position's logits, ours in float32, agree to 1e-4
    with Hugging Face's model run in float64: the values its code computes, without the
    rounding of its own float32 run, which depends on the CPU's vector code (v1.1's float32
    logits were 2.1e-4 from its float64 ones on an AMD EPYC host, ours 8.6e-5)."""
    model, cfg, params = t5(version)
    inputs = _tokens(0, (3, 26), lengths=[26, 9, 3])  # distances past max_distance (20)
    targets = _tokens(1, (3, 23), lengths=[23, 4, 11])
    decoder_inputs = np.pad(targets, ((0, 0), (1, 0)), constant_values=PAD)[:, :-1]
    with torch.no_grad():
        want = model.double()(
            input_ids=torch.from_numpy(inputs).long(),
            attention_mask=torch.from_numpy(inputs != PAD).long(),
            decoder_input_ids=torch.from_numpy(decoder_inputs).long(),
        ).logits.numpy()
    with jax.default_matmul_precision('float32'):
        ours = np.asarray(jax.jit(Transformer(cfg).apply)({'params': params}, inputs, targets))
    real = targets != PAD
    assert np.abs(want[real]).max() > 1  # logits of weight, not of an empty network
    np.testing.assert_allclose(ours[real], want[real], atol=1e-4, rtol=0)


def test_greedy_steps_with_the_cache_equal_hugging_faces_generation():
    """T5 v1.1: our decoding steps with the key/value cache, from the start token 0 and fed
    each step's argmax, choose Hugging Face's greedy tokens (`generate`, num_beams=1, nothing
    forced, no end) with the same scores to 1e-4, past max_distance (20) steps: each step's
    query against every cached key's position."""
    model, cfg, params = t5('v1.1')
    inputs = _tokens(6, (2, 8), lengths=[8, 5])
    steps = 22
    want_tokens, want_scores = hf_greedy(model, inputs, PAD, steps)
    assert len(np.unique(want_tokens)) >= 3  # not one token over and over
    tokens, scores = cached_greedy(cfg, params, inputs, steps)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(scores, want_scores, atol=1e-4, rtol=0)


def test_a_madlad_400_3b_shaped_model_has_hugging_faces_parameter_count():
    """MADLAD-400-3B's shape (T5 v1.1: d_model 1024, 16 heads of d_kv 128, d_ff 8192, 32 + 32
    layers, V 256000, a head of its own), counted without memory on both sides (torch's meta
    device, plus the [V, D] head that transformers 5 ties to the embedding: `t5`; our
    `param_count` of the declared shapes): the same 2.94e9, the two tables [32, 16] included."""
    from transformer.model import param_count

    shape = dict(d_model=1024, d_kv=128, num_heads=16, d_ff=8192, num_layers=32, vocab_size=256000)
    config = transformers.T5Config(
        **shape, num_decoder_layers=32, feed_forward_proj='gated-gelu', tie_word_embeddings=False
    )
    with torch.device('meta'):
        tied = transformers.T5ForConditionalGeneration(config)
    theirs = sum(p.numel() for p in tied.parameters()) + 256000 * 1024
    ours = dict(OURS, vocab_size=256000, d_model=1024, head_dim=128, num_heads=16, d_ff=8192)
    ours |= dict(num_encoder_layers=32, num_decoder_layers=32)
    ours |= dict(relative_attention_num_buckets=32, relative_attention_max_distance=128)
    cfg = TransformerConfig(**ours, **VERSIONS['v1.1'][1])
    assert param_count(cfg) == theirs
    assert 2.9e9 < theirs < 3.0e9
