"""The output head (transformer/model/output_head.py) is the one rule of the logits: the model's
forward pass and the chunked loss (transformer/training/loss.py), which reads the projection
W, b and computes each chunk's logits with `output_logits`, give the same logits and the same
loss for every embedding sharing, with and without the logits' bias."""

import jax
import numpy as np
import pytest

from tests.model.test_model import D, V, random_params, random_tokens, tiny_config
from transformer.model import (
    PAD_ID,
    Transformer,
    hidden_and_projection,
    output_logits,
    teacher_forced_logits,
)
from transformer.training import fused_cross_entropy, steps

EPS = 0.1


def _expected_weight(params: dict, share: str) -> np.ndarray:
    """The matrix W [V, D] of logits = y W^T + b, read from the parameters by hand."""
    if share == 'all':
        return params['shared_embedding']['embedding']
    if share == 'target':
        return params['target_embedding']['embedding']
    return params['logits_dense']['kernel'].T


@pytest.mark.parametrize(
    'share, logits_bias',
    [
        ('all', False),
        ('all', True),
        ('target', True),
        ('none', False),
        pytest.param('target', False, marks=pytest.mark.long),
        pytest.param('none', True, marks=pytest.mark.long),
    ],
)
def test_the_forward_pass_and_the_chunked_loss_compute_the_same_logits(share, logits_bias):
    """The teacher-forced logits equal `output_logits` of the hidden states and the projection
    the chunked loss reads (W the target embedding or the head's own kernel transposed, b the
    bias or None), to float32 precision; the chunked loss's sums (7 positions of 2 rows in
    chunks of 3 tokens, the last chunk padded) equal those of the forward's logits, the argmax
    and the correct count exactly. Two of the six pairs are in the long tier (target without
    the bias, none with it): the suite's four read the same W of each sharing and the same b."""
    cfg = tiny_config(share_embeddings=share, logits_bias=logits_bias)
    model, params = Transformer(cfg), random_params(cfg)
    if logits_bias:
        params['logits_bias'] = np.linspace(-2.0, 2.0, V)
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    inputs = random_tokens(1, (2, 5), lengths=[5, 3])
    targets = random_tokens(2, (2, 7), lengths=[7, 4])
    weights = (targets != PAD_ID).astype(np.float32)

    @jax.jit
    def both(params):
        logits = teacher_forced_logits(model, params, inputs, targets)
        hidden, (weight, bias) = hidden_and_projection(model, params, inputs, targets)
        chunk = output_logits(hidden.reshape(1, -1, D), weight, bias, cfg.dtype)
        full = steps.cross_entropy_with_smoothing(logits, targets, weights, EPS)
        correct = ((logits.argmax(-1) == targets) * weights).sum()
        chunked = fused_cross_entropy(hidden, weight, bias, targets, weights, EPS, 3, cfg.dtype)
        return logits, chunk.reshape(logits.shape), (weight, bias), (*full, correct), chunked

    with jax.default_matmul_precision('float32'):
        logits, chunk, (weight, bias), full, chunked = both(params)
    np.testing.assert_array_equal(weight, _expected_weight(params, share))
    if logits_bias:
        np.testing.assert_array_equal(bias, params['logits_bias'])
    else:
        assert bias is None
    assert np.abs(logits).max() > 0.5  # logits of a size that a wrong W or b would show
    np.testing.assert_allclose(chunk, logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(chunked[:2], full[:2], rtol=1e-5)
    np.testing.assert_array_equal(chunk.argmax(-1), logits.argmax(-1))
    assert chunked[2] == full[2]
