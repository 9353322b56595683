"""Device- and host-specific settings, one file each, named for what it does. Every choice
that depends on the accelerator is made here; the model, the training step and the searches
ask for it through this public API (``from transformer import backends``; ``backends.einsum``), and
nothing here knows the model.

Modules:

- platform.py: the choices, 'auto' resolved to the backend's measured winner.
- products.py: the matrix products, bfloat16 at bfloat16 speed on CPUs.
- logits_layout.py: the tied logits, their embedding gradient laid out for a CPU.
- segment_attention.py: Pallas's GPU flash attention over packed rows (segment ids).
- fetch.py: host reads that raise a failed computation's error instead of waiting.
- host_memory.py, compile_cache.py: the host memory this process may still take and glibc's
  malloc settings; jax's compilation cache; imported
  when named (``from transformer.backends import host_memory``), not with the model.
"""

from transformer.backends.fetch import fetch
from transformer.backends.logits_layout import tied_logits
from transformer.backends.platform import (
    attention_impl,
    cache_chunks,
    embedding_grad,
    fitted_lone_batch,
    on_cpu,
    staged_search,
)
from transformer.backends.products import dense_dot_general, einsum
from transformer.backends.segment_attention import packed_self_attention

__all__ = [
    'attention_impl',
    'cache_chunks',
    'compile_cache',
    'dense_dot_general',
    'einsum',
    'embedding_grad',
    'fetch',
    'fitted_lone_batch',
    'host_memory',
    'logits_layout',
    'on_cpu',
    'packed_self_attention',
    'platform',
    'products',
    'segment_attention',
    'staged_search',
    'tied_logits',
]
