"""``model.layer_norm_epsilon`` reaches every layer norm of the network: each sub-layer's
(encoder, decoder; post-LN and pre-LN) and pre-LN's two final ones. fairseq's transformer uses
1e-5 (torch's LayerNorm default), ours 1e-6 by default."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.tiny_run import tiny_model


@pytest.mark.parametrize('pre_layer_norm', [False, True])
def test_every_layer_norm_reads_the_configs_epsilon(pre_layer_norm):
    """Every LayerNorm call of a teacher-forced forward pass, found by intercepting them, has
    the config's epsilon; there are 2 per encoder layer, 3 per decoder layer, and with pre-LN
    the encoder's and the decoder's final norm."""
    model = tiny_model(
        pre_layer_norm=pre_layer_norm,
        layer_norm_epsilon=3e-5,
        num_encoder_layers=2,
        num_decoder_layers=2,
    )
    tokens = np.array([[3, 4, 1]], np.int32)
    params = model.init(jax.random.key(0), tokens, tokens)['params']
    seen = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, nn.LayerNorm) and context.method_name == '__call__':
            seen.append((context.module.path, context.module.epsilon))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        model.apply({'params': params}, tokens, tokens)
    assert len(seen) == 2 * 2 + 3 * 2 + (2 if pre_layer_norm else 0)
    assert len({path for path, _ in seen}) == len(seen)
    assert {epsilon for _, epsilon in seen} == {3e-5}
