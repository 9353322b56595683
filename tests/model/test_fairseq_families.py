"""Whole models of fairseq's families against Hugging Face's: a tiny M2M100 (the layout of
NLLB-200 too) and a tiny mBART, built by transformers with random weights, copied into this
package's Transformer by the table of transformer/interop/fairseq_params.py, give the same
teacher-forced logits to 1e-4 in float32 on the same token ids, padding included (padding id
1, the decoder's start </s> (2) fed to both). The options each family needs are model settings
and entries (tests/model/test_fairseq_options.py); this is the proof that together they are
the family's network (tests/interop/test_fairseq_params.py reads them from saved
directories)."""

import functools

import jax
import numpy as np
import pytest

from tests.model.cached_greedy import cached_greedy, hf_greedy
from transformer.interop.fairseq_params import params_from_state_dict
from transformer.model import Transformer, TransformerConfig
from transformer.tokens import SpecialIds

pytestmark = pytest.mark.slow  # transformers' models are imported and built
torch = pytest.importorskip('torch', reason="torch is not installed: pip install -e '.[export]'")
transformers = pytest.importorskip(
    'transformers', reason="transformers is not installed: pip install -e '.[export]'"
)

V, D, HEADS, F, LAYERS, PAD, EOS = 40, 16, 2, 32, 2, 1, 2
TABLE = 20  # mBART's max_position_embeddings here
# The Hugging Face config of each family (fairseq's ids: <s> 0, <pad> 1, </s> 2) and the
# options of ours that build the same network.
SHAPE = dict(
    vocab_size=V,
    d_model=D,
    encoder_layers=LAYERS,
    decoder_layers=LAYERS,
    encoder_attention_heads=HEADS,
    decoder_attention_heads=HEADS,
    encoder_ffn_dim=F,
    decoder_ffn_dim=F,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    max_position_embeddings=TABLE,
    pad_token_id=PAD,
    bos_token_id=0,
    eos_token_id=EOS,
    decoder_start_token_id=EOS,
)
OURS = dict(
    vocab_size=V,
    d_model=D,
    num_heads=HEADS,
    d_ff=F,
    num_encoder_layers=LAYERS,
    num_decoder_layers=LAYERS,
    dropout_rate=0.0,
    pre_layer_norm=True,  # a LayerNorm before each sub-layer, one closing each stack
    attention_bias=True,
    layer_norm_epsilon=1e-5,  # torch's LayerNorm
    # fairseq's dictionary: <s> 0, <pad> 1, </s> 2 (also the decoder's start), <unk> 3.
    special=SpecialIds(pad=PAD, eos=EOS, unk=3, decoder_start=EOS, never_emit=(PAD,)),
    attention_impl='einsum',
)
FAMILIES = {
    'm2m100': (
        'M2M100Config',
        'M2M100ForConditionalGeneration',
        dict(activation_function='relu', scale_embedding=True),
        dict(ffn='relu', positions='fairseq_sinusoidal', scale_embedding=True),
    ),
    'mbart': (
        'MBartConfig',
        'MBartForConditionalGeneration',
        dict(activation_function='gelu', scale_embedding=False),
        dict(
            ffn='gelu',
            positions='bart_learned',
            max_positions=TABLE,
            layernorm_embedding=True,
            logits_bias=True,
            scale_embedding=False,
        ),
    ),
}


@functools.cache
def family(name: str):
    """(Hugging Face's model, our config, our parameters) of ``name``: every weight drawn,
    torch seeded, so that none hides behind an init of ones or zeros: the norms' scales from
    N(1, 0.2^2) and their biases from N(0, 0.2^2) (larger ones make one token win every
    greedy step), the rest (the logits' bias too) from N(0, 0.5^2)."""
    config_class, model_class, hf_options, our_options = FAMILIES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**SHAPE, **hf_options)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for path, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if 'norm' in path:
                tensor.normal_(1.0 if path.endswith('weight') else 0.0, 0.2)
            else:
                tensor.normal_(0.0, 0.5)
    # M2M100's sinusoid table is a buffer, computed: it keeps its values (and its zero row).
    if name == 'm2m100':
        for stack in (model.model.encoder, model.model.decoder):
            positions = stack.embed_positions
            positions.make_weights(positions.weights.shape[0], D, PAD)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    cfg = TransformerConfig(**OURS, **our_options)
    return model, cfg, params_from_state_dict(weights, cfg, name)


def _tokens(seed: int, shape: tuple[int, int], lengths) -> np.ndarray:
    """Ids in [3, V) ending with </s> (2), padded with 1 after lengths[b] (right padding)."""
    tokens = np.random.default_rng(seed).integers(3, V, shape)
    tokens[np.arange(len(lengths)), np.asarray(lengths) - 1] = EOS
    tokens[np.arange(shape[1])[None, :] >= np.asarray(lengths)[:, None]] = PAD
    return tokens.astype(np.int32)


@pytest.mark.parametrize('name', FAMILIES)
def test_teacher_forced_logits_equal_hugging_faces(name):
    """The same ids to both: source [B, S] right-padded with 1 under its attention mask, and
    the decoder's inputs our shifted targets (</s> = 2, the family's decoder start, then the
    targets; 1 after each row's end).
    Every real target position's logits agree to 1e-4."""
    model, cfg, params = family(name)
    inputs = _tokens(0, (3, 7), lengths=[7, 4, 2])
    targets = _tokens(1, (3, 6), lengths=[6, 3, 5])
    decoder_inputs = np.pad(targets, ((0, 0), (1, 0)), constant_values=EOS)[:, :-1]
    with torch.no_grad():
        want = model(
            input_ids=torch.from_numpy(inputs).long(),
            attention_mask=torch.from_numpy(inputs != PAD).long(),
            decoder_input_ids=torch.from_numpy(decoder_inputs).long(),
        ).logits.numpy()
    with jax.default_matmul_precision('float32'):
        ours = np.asarray(Transformer(cfg).apply({'params': params}, inputs, targets))
    real = targets != PAD
    assert np.abs(want[real]).max() > 1  # logits of weight, not of an empty network
    np.testing.assert_allclose(ours[real], want[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize('name', FAMILIES)
def test_greedy_steps_with_the_cache_equal_hugging_faces_generation(name):
    """Our decoding steps with the key/value cache, from the start token </s> and fed each
    step's argmax, choose Hugging Face's greedy tokens (`generate`, num_beams=1, from the
    same start, nothing forced, no end) with the same scores to 1e-4: cached decoding at the
    step's position is the family's (fairseq's sinusoids from the padding id + 1, mBART's row
    p + 2)."""
    model, cfg, params = family(name)
    inputs = _tokens(6, (2, 6), lengths=[6, 3])  # a source whose outputs are not one token
    steps = 7
    flags = dict(decoder_start_token_id=EOS, forced_bos_token_id=None, forced_eos_token_id=None)
    want_tokens, want_scores = hf_greedy(model, inputs, PAD, steps, **flags)
    assert len(np.unique(want_tokens)) >= 3  # not one token over and over
    tokens, scores = cached_greedy(cfg, params, inputs, steps)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(scores, want_scores, atol=1e-4, rtol=0)
