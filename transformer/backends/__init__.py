"""Device- and host-specific settings, one file each, named for what it does. The model and
the commands call them; nothing here knows the model.

Modules (each a public name of this face: ``from transformer.backends import products``):

- platform.py: the accelerator-dependent choices, 'auto' resolved to the measured winner.
- products.py: the model's matrix products, bfloat16 at bfloat16 speed on CPUs.
- logits_layout.py: the tied logits with their embedding gradient laid out for a CPU.
- segment_attention.py: Pallas's GPU flash attention over packed rows (segment ids).
- host_memory.py: glibc's malloc settings for CPU training steps (``configure()``).
- compile_cache.py: jax's persistent compilation cache (``configure()``).
- fetch.py: ``fetch``, host reads that raise a failed computation's error instead of waiting.

The modules are imported when a caller names them, not by importing this package: importing
the model brings neither host_memory nor compile_cache.
"""

from transformer.backends.fetch import fetch

__all__ = [
    'compile_cache',
    'fetch',
    'host_memory',
    'logits_layout',
    'platform',
    'products',
    'segment_attention',
]
