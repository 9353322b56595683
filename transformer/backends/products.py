"""Matrix products of the model, with bfloat16 operands multiplied at bfloat16 speed on CPUs.

XLA's CPU backend computes a product of two bfloat16 arrays whose result is bfloat16 by
upcasting both to float32: it runs at float32 speed. The same product asked for with a
float32 result (`preferred_element_type`) runs on the CPU's bfloat16 dot-product
instructions (AVX512-BF16 and the like): 1.5x (the tied logits) to ~2x (the other products of a
Multi30k step) the float32 rate on a 2-core AMD EPYC (docs/experiments.md: products_speed.py). Both
accumulate in float32 and round the result to bfloat16, so the numbers agree; only the speed
differs.

`einsum` therefore asks for float32 results and casts them back when both operands are
bfloat16 on a CPU and the product is a plain matrix product (activations times a weight: no
index shared by both operands and the result), and gives the backward pass the same treatment
through a custom gradient (autodiff's gradient products would multiply a float32 cotangent by
a bfloat16 operand, which XLA upcasts again). Batched products (the attention matrices) stay
`jnp.einsum`: XLA hands some of their layouts to a kernel without a bfloat16 x bfloat16 ->
float32 case, which fails when the step runs. So does everything else (float32 and float16,
GPUs and TPUs, whose matrix units take 16-bit operands with float32 accumulation already).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.backends import platform

Array = jax.Array


def _bfloat16_on_cpu(a: Array, b: Array) -> bool:
    # float16 is left alone: the same float32-result product measured no faster than the plain
    # one on the AMD EPYC (6.86 vs 6.80 ms for a [2048, 256] x [256, 1024] product).
    bf16 = jnp.dtype(jnp.bfloat16)
    return a.dtype == bf16 and b.dtype == bf16 and platform.on_cpu()


def einsum(equation: str, a: Array, b: Array, precision=None) -> Array:
    """``jnp.einsum(equation, a, b, precision=precision)`` of two operands (see the module
    docstring; the bfloat16 CPU path multiplies bfloat16 values whatever the precision).

    The equation names its output explicitly (``'BTD,DNH->BTNH'``). For the bfloat16 CPU path
    every index of an operand must also appear in the other operand or the output, as in every
    product of this package: the gradients are then the einsums with the roles of the terms
    exchanged.
    """
    lhs, rhs, out = _split(equation)
    if _bfloat16_on_cpu(a, b) and not set(lhs) & set(rhs) & set(out):
        return _bf16_einsum(equation, a, b)
    return jnp.einsum(equation, a, b, precision=precision)


def _split(equation: str) -> tuple[str, str, str]:
    inputs, output = equation.replace(' ', '').split('->')
    lhs, rhs = inputs.split(',')
    return lhs, rhs, output


def _terms(equation: str) -> tuple[str, str, str]:
    lhs, rhs, output = _split(equation)
    for name, term, others in (('first', lhs, rhs + output), ('second', rhs, lhs + output)):
        if len(set(term)) != len(term) or not set(term) <= set(others):
            raise ValueError(
                f'einsum {equation!r}: every index of the {name} operand must appear once in '
                'it and again in the other operand or the output.'
            )
    return lhs, rhs, output


def _product(equation: str, a: Array, b: Array, dtype) -> Array:
    return jnp.einsum(equation, a, b, preferred_element_type=jnp.float32).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bf16_einsum(equation: str, a: Array, b: Array) -> Array:
    _terms(equation)
    return _product(equation, a, b, a.dtype)


def _bf16_einsum_fwd(equation: str, a: Array, b: Array):
    return _bf16_einsum(equation, a, b), (a, b)


def _bf16_einsum_bwd(equation: str, residuals, g: Array):
    a, b = residuals
    lhs, rhs, out = _terms(equation)
    g = g.astype(a.dtype)
    da = _product(f'{out},{rhs}->{lhs}', g, b, a.dtype)
    db = _product(f'{lhs},{out}->{rhs}', a, g, b.dtype)
    return da, db


_bf16_einsum.defvjp(_bf16_einsum_fwd, _bf16_einsum_bwd)


def dense_dot_general(lhs: Array, rhs: Array, dimension_numbers, precision=None, **_) -> Array:
    """`einsum` as the ``dot_general`` of a dense layer (flax's ``Dense``): [..., D] x [D, F] ->
    [..., F]."""
    (lhs_contract, rhs_contract), batch = dimension_numbers
    if tuple(lhs_contract) != (lhs.ndim - 1,) or tuple(rhs_contract) != (0,) or batch != ((), ()):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision)
    lead = 'abcdefgh'[: lhs.ndim - 1]
    return einsum(f'{lead}x,xy->{lead}y', lhs, rhs, precision=precision)
