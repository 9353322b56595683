"""The choices that depend on the accelerator, made here once, each where it was measured to
help (benchmarks/README.md); everywhere else the plain computation runs.

Asked at trace time, never on import: ``import transformer`` starts no jax backend.
"""

from __future__ import annotations

import jax


def on_cpu() -> bool:
    """Whether the default jax backend is the host CPU."""
    return jax.default_backend() == 'cpu'


def attention_impl(name: str) -> str:
    """The attention implementation a config's ``model.attention_impl`` names: 'auto' is
    'fused' (cuDNN's flash attention through `jax.nn.dot_product_attention`) on a GPU, where
    it is the faster one, and 'einsum' elsewhere, where it is (and where visualize can read its
    weights)."""
    if name != 'auto':
        return name
    return 'fused' if jax.default_backend() == 'gpu' else 'einsum'


def scatter_free_embedding_grad() -> bool:
    """Whether the embedding lookup's gradient is a one-hot product instead of a scatter-add
    (transformer/model/embedding.py): on a GPU, where the scatter was 9% of the base step's
    kernel time in a profile on an H200 and the product runs on the matrix units; on a CPU the
    product costs ~80x the scatter (benchmarks/README.md, products_speed.py)."""
    return jax.default_backend() == 'gpu'


def cache_chunks() -> int:
    """Chunks of a decoding self-attention cache that a step reads up to the one it writes
    (transformer/model/cache.py): 4 on a CPU, where reading a prefix saves work; one (the
    whole cache, no branch) elsewhere."""
    return 4 if on_cpu() else 1


def staged_search() -> bool:
    """Whether a search narrows its batch as examples finish (`next_token.shrinking_loop`):
    on a CPU each finished row is work saved; on an accelerator the extra loops cost compile
    time (the first decode of a command) for little."""
    return on_cpu()
