"""The choices that depend on the accelerator, made here once: a config value 'auto' becomes the
measured winner of `WINNERS` for the backend the program is traced for; everywhere else the
plain computation runs.

`WINNERS` holds only measured choices: each entry names the benchmark that decided it, with
its device, command and figures in benchmarks/README.md ("Step variants"). A choice changes
here only with a figure from the device it is for.

Asked at trace time, never on import: ``import transformer`` starts no jax backend.
"""

from __future__ import annotations

import jax

# choice -> {backend: the value 'auto' resolves to}; '*' is every backend not listed.
WINNERS: dict[str, dict[str, str]] = {
    # H100, base config, bfloat16 (step_variants.py): fused (cuDNN flash) 41.35 ms/step,
    # Pallas with segment ids 42.64, einsum 50.28; on a CPU einsum, which also sows the weights
    # for visualize.
    'attention_impl': {'gpu': 'fused', '*': 'einsum'},
    # H100, same run: the scatter-add 41.35 ms/step, sorted scatter 41.52, one-hot products
    # 49.01; CPU: the scatter 0.56 ms against the products' 48 ms (docs/experiments.md,
    # products_speed.py --embedding_grad).
    'embedding_grad': {'*': 'scatter'},
}


def on_cpu() -> bool:
    """Whether the default jax backend is the host CPU."""
    return jax.default_backend() == 'cpu'


def resolve(choice: str, value: str) -> str:
    """``value`` of the config field ``choice``; 'auto' is this backend's measured winner."""
    if value != 'auto':
        return value
    table = WINNERS[choice]
    return table.get(jax.default_backend(), table['*'])


def attention_impl(name: str) -> str:
    """The attention implementation a config's ``model.attention_impl`` names ('auto': the
    winner of `WINNERS`: cuDNN's flash attention on a GPU, einsum elsewhere)."""
    return resolve('attention_impl', name)


def embedding_grad(name: str) -> str:
    """The embedding gradient a config's ``model.embedding_grad`` names
    (transformer/model/embedding.py; 'auto': the winner of `WINNERS`)."""
    return resolve('embedding_grad', name)


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


def fitted_lone_batch() -> bool:
    """Whether lines that fit in one decoding batch decode in a batch sized to them (the
    smallest power of two that holds them) rather than padded to ``eval.batch_size``: on a CPU
    every filler row is work, and a batch under 16 rows compiles one loop (`staged_search`);
    on an accelerator filler rows cost little, and one shape per length serves calls of any
    number of lines with one compilation."""
    return on_cpu()
