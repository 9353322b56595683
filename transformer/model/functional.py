"""What the rest of the package does with the model, as functions of (model, parameters,
arrays): its functional interface. Training, decoding, checkpoints, the API and the benchmarks
call these and nothing of Flax's module API (``init``, ``apply``, ``method=``, boxed parameters,
logical partitioning), so the Flax API the network is written in is this package's business alone
(docs/nnx.md says what a port to Flax NNX would change here and what it must keep).

``model`` is the `Transformer` of a config (its ``config`` is the only attribute callers
read); parameters are a plain tree of arrays, ``{'encoder_layer_0': {'self_attention':
{'query': {'kernel': [D, N, H]}}}, ...}`` (the paths of `variants.param_shapes`), or, for a
model with ``scan_layers``, the same leaves stacked per stack, ``{'encoder_layers': {...
[L, D, N, H]}}`` (`layer_stack.stack` / `unstack` convert; what reads the per-layer tree
unstacks); a decoding cache is a plain tree too (transformer/model/cache.py).

Shape legend (transformer/model/attention.py): B batch · T target positions · S source
positions · D d_model · V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.model import layer_stack
from transformer.model.config import TransformerConfig
from transformer.model.packing import Packing
from transformer.model.transformer import Transformer

Array = jax.Array
PyTree = Any
# The token rows the init runs the network on: its parameters do not depend on them.
_INIT_LENGTH = 8


def init_params(model: Transformer, rng: Array, length: int = _INIT_LENGTH) -> PyTree:
    """Fresh parameters, plain arrays: Glorot kernels, N(0, D^-1/2) embeddings (what training
    starts from). ``length``: the token rows the init traces the network with."""
    dummy = jnp.ones((1, length), jnp.int32)
    if model.config.scan_layers:  # the unrolled model's values, layer i at index i
        unrolled = Transformer(dataclasses.replace(model.config, scan_layers=False))
        return layer_stack.stack(init_params(unrolled, rng, length))
    return nn.unbox(model.init(rng, dummy, dummy)['params'])


def abstract_params(model: Transformer) -> PyTree:
    """The parameters' shapes and dtypes (`jax.ShapeDtypeStruct`), allocating nothing. Traced
    once per model configuration in a process (a third of a second for a tiny model, more
    for a large one: each checkpoint a command loads asks again); each call gets a tree of
    its own."""
    return jax.tree.map(lambda x: x, _abstract_params(model.config))


@functools.lru_cache(maxsize=16)
def _abstract_params(config: TransformerConfig) -> PyTree:
    return jax.eval_shape(lambda: init_params(Transformer(config), jax.random.key(0)))


def logical_partition_specs(
    model: Transformer, build: Callable[[PyTree], PyTree] | None = None
) -> PyTree:
    """The logical `PartitionSpec` of every parameter (its axis names: 'embed', 'heads',
    'kv', 'mlp', 'vocab'), or of every leaf of ``build(params)``: a tree built leaf by leaf
    from the parameters (a train state whose optimizer moments inherit their parameter's
    names); a leaf not made from one gets ``PartitionSpec()``. Abstract: nothing is
    allocated. The parameters' own (``build`` None) are traced once per configuration in a
    process, as `abstract_params` is."""
    if build is None:
        return jax.tree.map(lambda x: x, _partition_specs(model.config))
    return _traced_partition_specs(model, build)


@functools.lru_cache(maxsize=16)
def _partition_specs(config: TransformerConfig) -> PyTree:
    return _traced_partition_specs(Transformer(config), None)


def _traced_partition_specs(model: Transformer, build: Callable[[PyTree], PyTree] | None):
    dummy = jnp.ones((1, _INIT_LENGTH), jnp.int32)

    def described():
        params = model.init(jax.random.key(0), dummy, dummy)['params']
        return params if build is None else build(params)

    return nn.get_partition_spec(jax.eval_shape(described))


def logical_shardings(
    specs: PyTree, mesh: jax.sharding.Mesh, rules: tuple[tuple[str, str | None], ...]
) -> PyTree:
    """`NamedSharding`s of ``specs`` (`logical_partition_specs`) on ``mesh``, each logical
    axis placed by ``rules`` (logical name -> mesh axis, None: replicated)."""
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def in_activation_layout(
    fn: Callable, mesh: jax.sharding.Mesh, rules: tuple[tuple[str, str | None], ...]
) -> Callable:
    """``fn`` (a step that calls the model) traced with the model's activations constrained
    (transformer/model/constraints.py: 'batch', 'length', 'embed' between the layers, 'heads'
    and 'mlp' inside them) to ``mesh`` by ``rules``, the table that places the parameters;
    on a mesh of one device, ``fn`` itself. Elsewhere the constraints do nothing."""
    if mesh.size == 1:
        return fn

    def traced(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return fn(*args)

    traced.__name__ = getattr(fn, 'func', fn).__name__  # jit names the program after it
    return traced


def _forward_args(packing: Packing | None, rng: Array | None) -> dict[str, Any]:
    # The modules' dropout switch is Flax's ``deterministic``; here an rng turns it off.
    return {
        'deterministic': rng is None,
        'rngs': {'dropout': rng} if rng is not None else None,
        'packing': packing,
    }


def teacher_forced_logits(
    model: Transformer,
    params: PyTree,
    inputs: Array,
    targets: Array,
    *,
    packing: Packing | None = None,
    rng: Array | None = None,
) -> Array:
    """float32 logits [B, T, V] for source [B, S] and target [B, T] tokens; position t
    predicts ``targets[:, t]``. ``packing``: several examples a row; ``rng``: the dropout
    key of a training forward pass; None means deterministic (no dropout), the modules'
    ``deterministic=True``."""
    return model.apply({'params': params}, inputs, targets, **_forward_args(packing, rng))


def _hidden_and_projection(module: Transformer, inputs: Array, targets: Array, **kwargs):
    return module(inputs, targets, logits=False, **kwargs), module.output_projection()


def hidden_and_projection(
    model: Transformer,
    params: PyTree,
    inputs: Array,
    targets: Array,
    *,
    packing: Packing | None = None,
    rng: Array | None = None,
) -> tuple[Array, tuple[Array, Array | None]]:
    """What a loss that never forms the [B, T, V] logits reads instead
    (transformer/training/loss.py): the decoder's last hidden states [B, T, D] (in the
    model's dtype) and the pre-softmax projection as stored, a [V, D] matrix W and its bias
    [V] or None: logits = hidden W^T + b. Arguments as `teacher_forced_logits`'s."""
    return model.apply(
        {'params': params},
        inputs,
        targets,
        method=_hidden_and_projection,
        **_forward_args(packing, rng),
    )


def encode(model: Transformer, params: PyTree, inputs: Array) -> Array:
    """The encoder's output [B, S, D] for source tokens [B, S] (no dropout)."""
    return model.apply({'params': params}, inputs, method=Transformer.encode)


def init_cache(
    model: Transformer, params: PyTree, encoded: Array, inputs: Array, max_decode_len: int
) -> PyTree:
    """The decoding cache of ``max_decode_len`` positions for `decode_step`.

    Self-attention caches (``cached_key`` / ``cached_value`` [B, N, max_decode_len, H]) start
    as zeros and are written one position per step. Encoder-decoder attention caches
    (``cached_static_key`` / ``cached_static_value`` [B, N, S, H]) hold the projections of
    ``encoded``, made here once so that no step repeats them (4 S D^2 multiply-adds per row
    and layer).

    Args:
      model: the Transformer.
      params: its parameters.
      encoded: encoder output [B, S, D] (`encode`).
      inputs: source tokens [B, S] (only the shape is used).
      max_decode_len: number of decoding steps the cache must hold.
    """
    targets = jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32)
    # The call that creates the cache runs the decoder over all max_decode_len positions; only
    # the cache is kept, so under jit XLA drops everything but the projections.
    _, variables = model.apply(
        {'params': params},
        encoded,
        inputs,
        targets,
        decode=True,
        method=Transformer.decode,
        mutable=['cache'],
    )
    return variables['cache']


def decode_step(
    model: Transformer,
    params: PyTree,
    cache: PyTree,
    encoded: Array,
    inputs: Array,
    last_tokens: Array,
    cache_mask: Array | None = None,
) -> tuple[Array, PyTree]:
    """One cached decoder step: float32 logits [B, V] of the next token after ``last_tokens``
    [B] (the start token, ``model.config.special.decoder_start``, at the first step), and the
    cache advanced by one position.

    Args:
      cache: from `init_cache` or the previous step.
      encoded: encoder output [B, S, D] (read only by the call that made the cache).
      inputs: source tokens [B, S] (cross-attention's padding mask).
      cache_mask: boolean [B, 1, 1, S'] over the self-attention cache's keys, which of them
        each row may attend to (beam search's rows sharing cache rows); None: all written.
    """
    logits, variables = model.apply(
        {'params': params, 'cache': cache},
        encoded,
        inputs,
        last_tokens[:, None],
        decode=True,
        cache_mask=cache_mask,
        method=Transformer.decode,
        mutable=['cache'],
    )
    return logits[:, 0], variables['cache']
