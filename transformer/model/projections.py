"""The attention's projections: one [D, N, H] parameter per query / key / value, one
[N, H, D] for the output (Sec. 3.2), and the einsums that apply them.

Shape legend: B batch · T positions · D d_model · N heads · H head dim (d_k = d_v).

One parameter, two views
------------------------
The paper writes MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with
head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), W_i^Q in R^{d_model x d_k}. Implementations
argue whether that is h separate d_model x d_k layers or one d_model x (h d_k) layer. Here the
query kernel is one array ``w_q`` of shape [D, N, H] and it *is* both:

    head i's own matrix      W_i^Q = w_q[:, i, :]                  [D, H]
    the fused matrix         W^Q   = w_q.reshape(D, N * H)         [D, N*H]
                                   = [W_1^Q | W_2^Q | ... | W_N^Q]

because (x W^Q)[:, i*H:(i+1)*H] = x W_i^Q: column block i of the fused product is head i's
projection. Likewise the output kernel ``w_o`` [N, H, D] is W^O = w_o.reshape(N * H, D), whose
row block i, w_o[i], is the part of W^O that head i's output multiplies, so
Concat(head_1..head_h) W^O = sum_i head_i w_o[i]. The parameter count is therefore
4 * D * N * H whichever view is taken (= 4 D^2 when H = D / N, independent of N).
"""

from __future__ import annotations

from typing import Any

import einops
import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer import backends

Array = jax.Array
Dtype = Any

# Glorot/Xavier uniform with the fans of the 2-D matrix each kernel stands for: fan-in D and
# fan-out N*H for [D, N, H]; fan-in N*H and fan-out D for [N, H, D]. jax's initializers assume
# in_axis=-2, out_axis=-1, which for a 3-D kernel would give the wrong fans.
qkv_kernel_init = nn.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))
out_kernel_init = nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)

# Logical axis names of every parameter, declared where it is created: D -> 'embed',
# N -> 'heads', H -> 'kv', F -> 'mlp', V -> 'vocab'. transformer/training/parallel.py maps them onto
# mesh axes with one rules table, so tensor (or FSDP) parallelism follows the declaration,
# never a parameter's name.
QKV_AXES = ('embed', 'heads', 'kv')
OUT_AXES = ('heads', 'kv', 'embed')


def per_head(kernel: Array) -> Array:
    """[D, N, H] query/key/value kernel -> [N, D, H]: element i is head i's own W_i."""
    return einops.rearrange(kernel, 'D N H -> N D H')


def from_per_head(matrices: Array) -> Array:
    """Inverse of `per_head`: stack N per-head [D, H] matrices into a [D, N, H] kernel."""
    return einops.rearrange(matrices, 'N D H -> D N H')


def fused(kernel: Array) -> Array:
    """[D, N, H] kernel -> the [D, N*H] matrix of "one big linear layer" (no copy of meaning)."""
    return einops.rearrange(kernel, 'D N H -> D (N H)')


def unfused(matrix: Array, num_heads: int) -> Array:
    """Inverse of `fused`: a [D, N*H] matrix -> [D, N, H], column block i becoming head i."""
    return einops.rearrange(matrix, 'D (N H) -> D N H', N=num_heads)


def fused_out(kernel: Array) -> Array:
    """[N, H, D] output kernel -> W^O as the [N*H, D] matrix applied to Concat(heads)."""
    return einops.rearrange(kernel, 'N H D -> (N H) D')


def unfused_out(matrix: Array, num_heads: int) -> Array:
    """Inverse of `fused_out`: a [N*H, D] matrix -> [N, H, D], row block i becoming head i."""
    return einops.rearrange(matrix, '(N H) D -> N H D', N=num_heads)


class Projection(nn.Module):
    """One einsum with a kernel (and optional bias) whose axes the equation names.

    The parameters are made in ``setup`` so that `fused_projections` can read ``kernel`` and
    ``bias`` of several projections and apply them as one einsum.
    """

    equation: str
    kernel_shape: tuple[int, ...]
    bias_shape: tuple[int, ...]
    kernel_init: Any
    kernel_axes: tuple[str, ...]
    use_bias: bool
    dtype: Dtype
    param_dtype: Dtype

    def setup(self):
        kernel_init = nn.with_logical_partitioning(self.kernel_init, self.kernel_axes)
        self.kernel = self.param('kernel', kernel_init, self.kernel_shape, self.param_dtype)
        self.bias = None
        if self.use_bias:
            bias_axes = self.kernel_axes[-len(self.bias_shape) :]
            bias_init = nn.with_logical_partitioning(nn.initializers.zeros, bias_axes)
            self.bias = self.param('bias', bias_init, self.bias_shape, self.param_dtype)

    def __call__(self, x: Array) -> Array:
        y = backends.einsum(self.equation, x.astype(self.dtype), self.kernel.astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias.astype(self.dtype)
        return y


def fused_projections(x: Array, projections: tuple[Projection, ...]) -> tuple[Array, ...]:
    """``tuple(p(x) for p in projections)`` for [D, N, H] projections, as few einsums.

    The kernels of one shape are stacked on a new axis into one [D, P, N, H] view (the
    parameter tree is unchanged): one [B*T, D] x [D, P*N*H] product keeps the CPU's matrix
    units busier than P thin ones, and the backward pass reads ``x`` once instead of P times.
    Stacked, not concatenated on the head axis: with heads split over devices ('heads' on the
    'model' mesh axis), each device's block of the view is its own heads of every kernel, so
    no kernel or output moves between devices (concatenated, the split of [D, P*N, H] fell
    across kernels, and XLA moved kernel shards and their gradients at every step:
    docs/parallelism.md). Kernels of different shapes (the query's N heads beside the keys'
    and values' K < N heads) are never stacked together: each run of equal shapes is one
    product, and each output has its own kernel's shape.
    """
    groups: list[list[Projection]] = []
    for p in projections:
        if groups and groups[-1][0].kernel_shape == p.kernel_shape:
            groups[-1].append(p)
        else:
            groups.append([p])
    return tuple(y for group in groups for y in _stacked(x, group))


def _stacked(x: Array, projections: list[Projection]) -> tuple[Array, ...]:
    """The outputs of projections of one kernel shape, as one einsum over their stack."""
    first = projections[0]
    if len(projections) == 1:
        return (first(x),)
    kernel = jnp.stack([p.kernel for p in projections], axis=1).astype(first.dtype)
    y = backends.einsum('BTD,DPNH->BTPNH', x.astype(first.dtype), kernel)
    if first.bias is not None:
        y = y + jnp.stack([p.bias for p in projections]).astype(first.dtype)
    # split (whose gradient is one concatenate), not P slices (P pads and adds)
    return tuple(part.squeeze(2) for part in jnp.split(y, len(projections), axis=2))
