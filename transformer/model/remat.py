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

jax keeps the recomputation in the backward pass with optimisation barriers on its inputs.
XLA's CPU compiler removes those barriers (its pass 'cse_barrier_expander') before it
schedules the program, and then computes the recomputation beside the forward pass and keeps
its results until the backward pass: no policy lowered XLA's temporaries on a CPU
(docs/experiments.md, "Rematerialisation policies on a CPU"). `compiler_options` turns that
pass off for a CPU train step with a policy, as the training step's compilation does
(transformer/training/parallel.py).
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


def compiler_options(policy: str, platform: str) -> dict[str, str] | None:
    """XLA options for compiling a train step of a model with ``policy`` on ``platform`` (a
    device's ``platform``): on a CPU with a policy other than 'none', the optimisation
    barriers that keep the recomputation in the backward pass stay until the program is
    scheduled (see the module's docstring); elsewhere None (the compiler's defaults)."""
    if policy == 'none' or platform != 'cpu':
        return None
    return {'xla_disable_hlo_passes': 'cse_barrier_expander'}


def rematerialized(layer: type[nn.Module], policy: str):
    """``layer`` (a module class) wrapped in `nn.remat` with ``policy`` (one of
    `REMAT_POLICIES`; 'none': ``layer`` itself). The layer's first argument is its Python
    flags (`layers.LayerFlags`), held static; the arguments after it may change."""
    if policy == 'none':
        return layer
    return nn.remat(layer, policy=_policy(policy), static_argnums=(1,))
