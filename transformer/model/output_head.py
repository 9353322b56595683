"""The output head: the pre-softmax linear transformation of the decoder's last hidden states
y [B, T, D] into the logits [B, T, V] (Sec. 3.4), written once.

    logits = y W^T + b        W [V, D], b [V]

* W is the target embedding E when the embeddings are tied (``model.share_embeddings`` 'all',
  Sec. 3.4's one matrix, or 'target'), times d_model^-0.5 where ``model.rescale_tied_head``
  (T5 v1.0's rescaled hidden states, the same product); else the head's own
  ``logits_dense/kernel`` [D, V] ('none', 'inputs': W is that kernel transposed).
* b is ``model.logits_bias``'s [V] parameter (MarianMT's ``final_logits_bias``, fixed in
  training unless ``opt.train_logits_bias``), else there is none.
* The product runs in the model's compute dtype, b is added in it, and the logits come out in
  float32.

Everything that turns hidden states into logits reads the rule here: the Transformer's forward
pass and every decoding step (`OutputHead.__call__`), and the chunked loss
(transformer/training/loss.py), which takes W and b from `OutputHead.projection` and computes
each chunk's logits with `logits`. A head of another kind changes `OutputHead` alone, and
both follow (its own matrix beside shared input embeddings, 'inputs', and T5 v1.0's rescaled
W did).

Shape legend (transformer/model/attention.py): B batch · T target positions · D d_model ·
V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer import backends
from transformer.model.config import TransformerConfig
from transformer.model.layers import partitioned

Array = jax.Array


def _own_matrix(cfg: TransformerConfig) -> bool:
    """Whether the head has its own matrix instead of the target embedding."""
    return cfg.share_embeddings in ('none', 'inputs')


def _plus_bias(z: Array, bias: Array | None, dtype) -> Array:
    if bias is not None:
        z = z + bias.astype(dtype)
    return z.astype(jnp.float32)


def logits(y: Array, weight: Array, bias: Array | None, dtype) -> Array:
    """float32 logits y W^T + b [B, T, V] of hidden states y [B, T, D] (a loss's chunk of C
    positions: [1, C, D]) and a projection W [V, D], b [V] or None (`OutputHead.projection`):
    the product in ``dtype``, b added in ``dtype``. The product is `backends.tied_logits`,
    whose gradient has a CPU's layout."""
    z = backends.tied_logits(y.astype(dtype), weight.astype(dtype))
    return _plus_bias(z, bias, dtype)


class OutputHead(nn.Module):
    """The pre-softmax projection of the module docstring. Its parameters, ``logits_dense``
    ([D, V] ``kernel``, share_embeddings 'none' or 'inputs') and ``logits_bias`` [V], sit at
    the Transformer's root: it shares the Transformer's scope (`nn.share_scope`)."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        if _own_matrix(cfg):
            self.logits_dense = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                kernel_init=partitioned(nn.initializers.lecun_normal(), ('embed', 'vocab')),
                dot_general=backends.dense_dot_general,
                name='logits_dense',
            )
        if cfg.logits_bias:
            # MarianMT's final_logits_bias: zeros, fixed unless opt.train_logits_bias.
            self.logits_bias = self.param(
                'logits_bias',
                partitioned(nn.initializers.zeros, ('vocab',)),
                (cfg.vocab_size,),
                cfg.param_dtype,
            )

    def _bias(self) -> Array | None:
        return self.logits_bias if self.config.logits_bias else None

    def projection(self, embedding: Array) -> tuple[Array, Array | None]:
        """W [V, D] and b [V] (None without one), in the param dtype, given the target
        embedding E [V, D]: logits = y W^T + b, what `__call__` computes. For a loss that
        never forms the [B, T, V] logits (transformer/training/loss.py). W is E as stored, or
        E d_model^-0.5 with ``model.rescale_tied_head``."""
        cfg = self.config
        if not _own_matrix(cfg):
            if cfg.rescale_tied_head:  # (y D^-0.5) E^T = y (E D^-0.5)^T
                embedding = embedding * cfg.d_model**-0.5  # weakly typed: E's dtype
            return embedding, self._bias()
        return self.logits_dense.variables['params']['kernel'].T, self._bias()

    def __call__(self, y: Array, embedding: Array) -> Array:
        """float32 logits [B, T, V] of hidden states y [B, T, D], given the target embedding
        E [V, D]: `logits` of `projection`'s W and b. The head's own matrix is multiplied in
        its stored [D, V] layout (y W^T = y kernel), so that no transpose of it is made."""
        cfg = self.config
        if not _own_matrix(cfg):
            return logits(y, *self.projection(embedding), cfg.dtype)  # y E^T (Sec. 3.4)
        return _plus_bias(self.logits_dense(y), self._bias(), cfg.dtype)
