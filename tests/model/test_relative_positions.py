"""model.positions='t5_relative' (transformer/model/relative_positions.py): T5's buckets, one
bias table per stack outside its layers (one copy scanned or not, not decayed, its logical
axes), packed rows by their own positions, cached decoding (beams sharing a cache too) equal to
teacher forcing, the scanned model equal to the unrolled one, and the configs refused in one
line. Hugging Face's T5 itself: tests/model/test_t5_family.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.random_params import fill_random
from tests.tiny_run import packed_batch, tiny_model
from transformer.fields import ConfigError
from transformer.model import (
    Packing,
    Transformer,
    TransformerConfig,
    abstract_params,
    beam_mask,
    decode_step,
    encode,
    hidden_and_projection,
    init_cache,
    logical_partition_specs,
    param_count,
    param_shapes,
    relative_position_buckets,
    share_across_beams,
    stack_layers,
    teacher_forced_logits,
    train_flops,
)
from transformer.model.relative_positions import RelativePositionBias
from transformer.training import optim, parallel

# Few buckets and a short max_distance, so that rows of 7-9 tokens reach the logarithmic
# buckets and the last one: bidirectional 2 exact + 2 wider a side, causal 4 + 4.
T5 = {
    'positions': 't5_relative',
    'relative_attention_num_buckets': 8,
    'relative_attention_max_distance': 6,
    'attention_scale': 1.0,
    'scale_embedding': False,
    'norm': 'rms_norm',
    'pre_layer_norm': True,
}
LAYERS = {'num_encoder_layers': 2, 'num_decoder_layers': 2}


def _model(**overrides) -> Transformer:
    return tiny_model(**T5, **LAYERS, **overrides)


# Compiled: op by op, the tiny models' forward passes cost seconds each on a CPU.
_logits = jax.jit(teacher_forced_logits, static_argnums=0)


def _params(model: Transformer, seed: int = 0) -> dict:
    params = fill_random(abstract_params(model), seed)
    for stack in ('encoder', 'decoder'):  # biases of the size T5's learn: they move the softmax
        table = params[f'{stack}_positions']['bias']
        table[...] = np.random.default_rng(seed).normal(0, 1.0, table.shape)
    return params


def test_buckets_are_t5s_at_its_default_sizes():
    """Hugging Face's T5Attention._relative_position_bucket(d, bidirectional, 32, 128), its
    values written down (every distance from -300 to 300: tests/model/test_t5_family.py)."""
    d = [-200, -128, -127, -64, -33, -32, -16, -15, -9, -8, -7, -1, 0, 1, 7, 8, 15, 16, 64, 127]
    d += [128, 500]
    both = [15, 15, 15, 14, 12, 12, 10, 9, 8, 8, 7, 1, 0, 17, 23, 24, 25, 26, 30, 31, 31, 31]
    causal = [31, 31, 31, 26, 21, 21, 16, 15, 9, 8, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    for bidirectional, want in ((True, both), (False, causal)):
        got = relative_position_buckets(
            jnp.asarray(d), bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        assert got.tolist() == want


def test_the_bias_is_the_tables_row_at_each_bucket():
    """bias[b, n, t, s] = table[bucket(position_s - position_t), n], causal or not."""
    model = _model()
    positions = jnp.asarray([[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 0, 1, 2, 3, 4]])
    for bidirectional in (True, False):
        module = RelativePositionBias(model.config, bidirectional)
        variables = module.init(jax.random.key(0), positions)
        table = np.asarray(variables['params']['bias'].unbox())
        bias = np.asarray(module.apply(variables, positions))
        assert bias.shape == (2, 4, 9, 9)
        distance = positions[:, None, :] - positions[:, :, None]
        buckets = relative_position_buckets(
            distance, bidirectional=bidirectional, num_buckets=8, max_distance=6
        )
        assert buckets.max() == 7  # the rows reach the last bucket, past max_distance
        np.testing.assert_array_equal(bias, np.moveaxis(table[np.asarray(buckets)], -1, 1))


def test_one_table_per_stack_outside_the_layers_one_copy_when_scanned():
    """[buckets, N] at the root of the tree, scanned or not; counted once each; logical axes
    ('relpos_buckets', 'heads'), the buckets replicated; not weight-decayed; the matmul FLOPs
    unchanged (a gather and an add: model/flops.py)."""
    model = _model()
    scanned = Transformer(dataclasses.replace(model.config, scan_layers=True))
    for m in (model, scanned):
        tree = jax.eval_shape(lambda m=m: abstract_params(m))
        for stack in ('encoder', 'decoder'):
            assert tree[f'{stack}_positions']['bias'].shape == (8, 4)
        assert param_shapes(m.config)['encoder_positions/bias'] == (8, 4)
    stacked = jax.eval_shape(stack_layers, abstract_params(model))
    assert jax.tree.structure(stacked) == jax.tree.structure(abstract_params(scanned))
    assert 'encoder_positions' not in abstract_params(scanned)['encoder_layers']
    plain = dataclasses.replace(model.config, positions='sinusoidal', **_DEFAULT_SIZES)
    assert param_count(model.config) - param_count(plain) == 2 * 8 * 4
    assert train_flops(model.config, 2, 9, 7) == train_flops(plain, 2, 9, 7)
    specs = logical_partition_specs(scanned)
    assert tuple(specs['decoder_positions']['bias']) == ('relpos_buckets', 'heads')
    assert dict(parallel.rules())['relpos_buckets'] is None
    decays = optim.decays(stacked)
    assert not decays['encoder_positions']['bias'] and not decays['decoder_positions']['bias']
    assert decays['encoder_layers']['ffn']['wi']['kernel']  # the weights still decay


_DEFAULT_SIZES = {'relative_attention_num_buckets': 32, 'relative_attention_max_distance': 128}


@pytest.mark.slow
def test_the_scanned_model_equals_the_unrolled_one():
    """The same parameters stacked, the tables as they are: the same logits, and the same
    gradients of the tables, which every layer's attention adds to."""
    model = _model()
    scanned = Transformer(dataclasses.replace(model.config, scan_layers=True))
    params = _params(model)
    rng = np.random.default_rng(1)
    inputs, targets = rng.integers(3, 32, (3, 9)), rng.integers(3, 32, (3, 8))
    weights = rng.standard_normal((3, 8, 32)).astype(np.float32)

    def loss(m, p):
        return (teacher_forced_logits(m, p, inputs, targets) * weights).sum()

    grad = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
    with jax.default_matmul_precision('float32'):
        (want, grads), (got, stacked_grads) = (
            grad(model, params),
            grad(scanned, stack_layers(params)),
        )
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for stack in ('encoder', 'decoder'):
        table = grads[f'{stack}_positions']['bias']
        # Every bucket the rows reach learns: all but one, which holds no whole distance
        # (bidirectional: keys after the query from distance 0; causal: from 4 to 5).
        assert (np.abs(table).max(axis=1) > 0).sum() == 7
        np.testing.assert_allclose(stacked_grads[f'{stack}_positions']['bias'], table, atol=1e-5)


def test_packed_rows_equal_each_example_alone():
    """Two examples a row, by their own positions and segments: each example's logits are
    those of the example alone, unpacked (its bias from its own positions 0, 1, ...)."""
    model = _model()
    params = _params(model)
    batch = packed_batch(3)
    alone = {'inputs': [], 'targets': []}  # every example in a row of its own, right-padded
    for row in range(batch['inputs'].shape[0]):
        for segment in (1, 2):
            for k in alone:
                tokens = batch[k][row][batch[f'{k}_segmentation'][row] == segment]
                alone[k].append(np.pad(tokens, (0, batch[k].shape[1] - len(tokens))))
    with jax.default_matmul_precision('float32'):
        packed = _logits(
            model, params, batch['inputs'], batch['targets'], packing=Packing.of(batch)
        )
        unpacked = _logits(model, params, *(np.stack(alone[k]) for k in alone))
    for row in range(batch['inputs'].shape[0]):
        for segment in (1, 2):
            where = batch['targets_segmentation'][row] == segment
            want = unpacked[2 * row + segment - 1][: where.sum()]
            np.testing.assert_allclose(packed[row][where], want, atol=2e-5)


def _teacher_forced_steps(model, params, inputs, rows_targets, beam: int):
    """Logits [rows, T, V] of cached steps fed ``rows_targets`` [rows, T] (rows = sources x
    ``beam``; with ``beam`` > 1 the rows of a source share one cache, each its own slot)."""
    steps = rows_targets.shape[1]
    encoded = jax.jit(encode, static_argnums=0)(model, params, inputs)
    cache = jax.jit(init_cache, static_argnums=(0, 4))(model, params, encoded, inputs, steps)
    cache = share_across_beams(cache, beam) if beam > 1 else cache
    rows = rows_targets.shape[0]
    history = jnp.tile(jnp.arange(rows) % beam, (steps, 1)).T  # row b*K + j writes slot j
    mask = beam_mask(history, beam) if beam > 1 else None
    shifted = np.pad(rows_targets, ((0, 0), (1, 0)))[:, :-1]  # the start (0), then targets
    inputs = np.repeat(inputs, beam, axis=0)  # each row's source (cross-attention's mask)
    step = jax.jit(decode_step, static_argnums=0)
    out = []
    for t in range(steps):
        logits, cache = step(model, params, cache, encoded, inputs, shifted[:, t], mask)
        out.append(logits)
    return np.stack(out, axis=1)


@pytest.mark.parametrize('beam', [1, 2])
def test_cached_decoding_equals_teacher_forcing(beam):
    """Each step's query at its position against every cached key's (the cache's key
    positions, K slots a position when beams share it): the teacher-forced logits of each
    row's targets, at distances past max_distance too."""
    model = _model()
    params = _params(model, seed=4)
    rng = np.random.default_rng(5)
    inputs = rng.integers(3, 32, (2, 9)).astype(np.int32)
    targets = rng.integers(3, 32, (2 * beam, 8)).astype(np.int32)
    sources = np.repeat(inputs, beam, axis=0)
    with jax.default_matmul_precision('float32'):
        want = _logits(model, params, sources, targets)
        got = _teacher_forced_steps(model, params, inputs, targets, beam)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.slow  # compiles greedy search at two batch schedules and scanned
def test_a_search_that_narrows_its_batch_keeps_the_caches_key_positions():
    """Greedy search narrows its batch as examples end (their rows of every cache array
    taken, `next_token.take_examples`, as beam search's are), here at each source's length + 2
    tokens, from 8 rows to 4 (each batch size is a loop to compile; a second narrowing takes
    rows by the same code: tests/decoding/test_decode.py narrows twice): the outputs equal
    those of the search that keeps the whole batch, and the scanned model's too. (Beams
    sharing a cache: test_cached_decoding_equals_teacher_forcing.)"""
    from transformer.decoding import DecodeOptions, greedy_search

    model = _model()
    scanned = Transformer(dataclasses.replace(model.config, scan_layers=True))
    params = _params(model, seed=8)
    rng = np.random.default_rng(9)
    inputs = rng.integers(3, 32, (8, 9)).astype(np.int32)
    inputs[np.arange(9)[None, :] >= rng.integers(2, 10, (8, 1))] = 0  # lengths 2 to 9
    options = DecodeOptions(extra_length=2)
    whole = greedy_search(model, params, inputs, options=options, min_stage_batch=8)
    narrowed = greedy_search(model, params, inputs, options=options, min_stage_batch=4)
    np.testing.assert_array_equal(narrowed, whole)
    scan = greedy_search(scanned, stack_layers(params), inputs, options=options, min_stage_batch=4)
    np.testing.assert_array_equal(scan, whole)
    assert len(set(map(tuple, np.asarray(whole)))) > 4  # outputs of different lengths, words


@pytest.mark.parametrize(
    ('overrides', 'words'),
    [
        ({'dtype': 'float16'}, "model.dtype=float16 overflows a model.positions='t5_relative'"),
        ({'param_dtype': 'float16'}, 'model.param_dtype=float16 overflows'),
        ({'relative_attention_num_buckets': 2}, 'set it to 4 or more'),
        ({'relative_attention_max_distance': 4}, 'must exceed half of'),
        ({'positions': 'rope'}, "sizes T5's relative position buckets, and model.positions='rope'"),
        ({'max_positions': 64}, 'model.max_positions=64 sizes a learned position table'),
        ({'share_embeddings': 'inputs', 'rescale_tied_head': True}, "'inputs' unties it"),
    ],
)
def test_configs_that_cannot_build_it_are_refused_in_one_line(overrides, words):
    from transformer.model import config_from_dict

    model = {**T5, **overrides}
    with pytest.raises(ConfigError) as error:
        config_from_dict(model, vocab_size=32)
    assert words in str(error.value) and '\n' not in str(error.value)


def test_bfloat16_builds():
    cfg = TransformerConfig(vocab_size=32, **T5, dtype=jnp.bfloat16)
    assert cfg.dtype == jnp.bfloat16


def test_a_rescaled_tied_head_is_t5_v1_0s():
    """logits = (y d_model^-0.5) E^T: the plain tied head's logits times d_model^-0.5, and the
    chunked loss reads the same W (E d_model^-0.5)."""
    plain = tiny_model()
    rescaled = Transformer(dataclasses.replace(plain.config, rescale_tied_head=True))
    params = fill_random(abstract_params(plain), 6)
    rng = np.random.default_rng(7)
    inputs, targets = rng.integers(3, 32, (2, 6)), rng.integers(3, 32, (2, 5))
    want = _logits(plain, params, inputs, targets) * 32**-0.5

    @jax.jit  # the rescaled head's logits and projection: one program, one compilation
    def logits_and_projection(params):
        logits = teacher_forced_logits(rescaled, params, inputs, targets)
        return logits, hidden_and_projection(rescaled, params, inputs, targets)[1]

    got, (weight, bias) = logits_and_projection(params)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert bias is None
    np.testing.assert_allclose(weight, params['shared_embedding']['embedding'] * 32**-0.5, 1e-6)
