"""Speed of the model's matrix products: float32, plain bfloat16, and `products.einsum`.

Times, for each product shape of a Multi30k step (64 x 32 tokens, d_model 256, d_ff 1024,
8000-token vocabulary) and a 2048^3 matmul, the best of ``--repeats`` jitted runs of

  float32        jnp.einsum on float32 operands
  bf16 plain     jnp.einsum on bfloat16 operands (bfloat16 result)
  bf16 products  transformer.products.einsum on the same operands (on a CPU: float32 result,
                 cast back to bfloat16)

each forward alone and forward + both gradients (`jax.vjp`, three products). Prints GFLOP/s
and saves JSON in results/. ``--embedding_grad`` times instead the gradient of the embedding
lookup of those 64 x 32 tokens, as a scatter-add and as the one-hot product of
transformer/model/embedding.py (best of ``--repeats``, float32 and bfloat16).

    .venv/bin/python benchmarks/products_speed.py
    .venv/bin/python benchmarks/products_speed.py --embedding_grad --out /tmp/embedding.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from transformer.backends import products  # noqa: E402
from transformer.model import EMBEDDING_GRADS, embedding_lookup  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
B, T, D, N, H, F, V = 64, 32, 256, 4, 64, 1024, 8000
SHAPES = {  # name: (equation, first operand shape, second operand shape)
    'q/k/v projection': ('BTD,DKH->BTKH', (B, T, D), (D, 3 * N, H)),
    'output projection': ('BTNH,NHD->BTD', (B, T, N, H), (N, H, D)),
    'FFN in': ('BTD,DF->BTF', (B, T, D), (D, F)),
    'FFN out': ('BTF,FD->BTD', (B, T, F), (F, D)),
    'tied logits': ('BTD,VD->BTV', (B, T, D), (V, D)),
    '2048^3 matmul': ('ij,jk->ik', (2048, 2048), (2048, 2048)),
}


def _flops(equation: str, shape_a, shape_b) -> int:
    """2 x (every index's size multiplied together): one multiply-add per index tuple."""
    lhs, rhs = equation.split('->')[0].split(',')
    sizes = dict(zip(lhs, shape_a, strict=True)) | dict(zip(rhs, shape_b, strict=True))
    count = 2
    for size in sizes.values():
        count *= size
    return count


def _with_grads(einsum, equation: str, a, b, g):
    """The product and both gradients for cotangent g: the three products of a train step."""
    out, vjp = jax.vjp(lambda a, b: einsum(equation, a, b), a, b)
    return out, vjp(g)


def _best(fn, args, repeats: int) -> float:
    return common.best_time(lambda: fn(*args), repeats)[1]['best_s']


def embedding_grad(repeats: int) -> list[dict]:
    """Milliseconds of the lookup's gradient, each `EMBEDDING_GRADS` variant."""
    rows = []
    key_t, key_c, key_e = jax.random.split(jax.random.key(0), 3)
    tokens = jax.random.randint(key_t, (B, T), 0, V)
    cotangent = jax.random.normal(key_c, (B, T, D))
    table = jax.random.normal(key_e, (V, D))
    for dtype in (jnp.float32, jnp.bfloat16):
        for grad in EMBEDDING_GRADS[1:]:  # not 'auto'

            def loss(e, grad=grad, dtype=dtype):
                looked_up = embedding_lookup(e, tokens, dtype, grad)
                return (looked_up.astype(jnp.float32) * cotangent).sum()

            seconds = _best(jax.jit(jax.grad(loss)), (table,), repeats)
            rows.append({'dtype': jnp.dtype(dtype).name, 'lookup': grad, 'ms': 1e3 * seconds})
            print(f'embedding gradient {rows[-1]["dtype"]:9} {grad:20} {rows[-1]["ms"]:8.2f} ms')
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--embedding_grad', action='store_true', help='time the lookup gradient')
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/products_speed.json'))
    args = parser.parse_args()
    if args.embedding_grad:
        rows = embedding_grad(args.repeats)
        common.write_report(args.out, common.host() | {'embedding_gradient_ms': rows})
        return
    variants = {
        'float32': (jnp.float32, jnp.einsum),
        'bf16 plain': (jnp.bfloat16, jnp.einsum),
        'bf16 products': (jnp.bfloat16, products.einsum),
    }
    rows = []
    print(f'{"product":18} {"variant":14} {"forward GFLOP/s":>16} {"fwd+grads GFLOP/s":>18}')
    for name, (equation, shape_a, shape_b) in SHAPES.items():
        flops = _flops(equation, shape_a, shape_b)
        for variant, (dtype, einsum) in variants.items():
            a = jnp.ones(shape_a, dtype)
            b = jnp.ones(shape_b, dtype)
            forward = jax.jit(lambda a, b, e=einsum, q=equation: e(q, a, b))
            grads = jax.jit(lambda a, b, g, e=einsum, q=equation: _with_grads(e, q, a, b, g))
            g = jnp.ones(jax.eval_shape(forward, a, b).shape, dtype)
            fwd = flops / _best(forward, (a, b), args.repeats) / 1e9
            both = 3 * flops / _best(grads, (a, b, g), args.repeats) / 1e9
            rows.append(dict(product=name, equation=equation, variant=variant, forward=fwd,
                             forward_and_grads=both))  # fmt: skip
            print(f'{name:18} {variant:14} {fwd:16.1f} {both:18.1f}')
    common.write_report(args.out, common.host() | {'gflops': rows})


if __name__ == '__main__':
    main()
