"""Rematerialisation (gradient checkpointing): what each layer keeps for the backward pass.

``model.remat`` wraps every encoder and decoder layer in Flax's `nn.remat` (`jax.checkpoint`)
with one of these policies; the parameter tree is the same under all of them:

- 'none': no wrapper; the backward pass reads every activation the forward pass made.
- 'full': a layer keeps only its input (the residual stream entering it); everything inside
  it is recomputed in the backward pass, one more forward pass of the layers.
- 'dots': the outputs of matrix products without batch dimensions are kept (the query / key /
  value / output projections and the feed-forward's products,
  `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`); the attention logits and
  probabilities, norms, activations and dropout masks are recomputed.
- 'attention': the attention's output (the heads' context vectors [B, T, N, H] of every
  attention sub-layer, named `ATTENTION_OUTPUT` where it is made) is kept, the rest
  recomputed.

Every policy keeps each layer's input, as the plain model does. A forward pass without a
gradient (validation, decoding) computes the same as without the wrapper.
"""

from __future__ import annotations

import jax
from flax import linen as nn

REMAT_POLICIES = ('none', 'full', 'dots', 'attention')
# The name `jax.ad_checkpoint.checkpoint_name` gives the attention's context vectors.
ATTENTION_OUTPUT = 'attention_output'


def _policy(name: str):
    if name == 'full':
        return jax.checkpoint_policies.nothing_saveable
    if name == 'dots':
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if name == 'attention':
        return jax.checkpoint_policies.save_only_these_names(ATTENTION_OUTPUT)
    raise ValueError(f'model.remat={name!r} must be one of ' + ', '.join(map(repr, REMAT_POLICIES)))


def rematerialized(layer: type[nn.Module], policy: str, static_argnums: tuple[int, ...]):
    """``layer`` (a module class) wrapped in `nn.remat` with ``policy`` (one of
    `REMAT_POLICIES`; 'none': ``layer`` itself). ``static_argnums``: the positions of its
    call's Python arguments (flags such as ``deterministic``), counting the module as 0;
    they must be passed positionally."""
    if policy == 'none':
        return layer
    return nn.remat(layer, policy=_policy(policy), static_argnums=static_argnums)
