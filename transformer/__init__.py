"""The encoder-decoder Transformer of "Attention Is All You Need", trained for translation.

Importing the package changes nothing in the process. The commands opt in to process-wide
settings when they start (transformer/commands/console.py): glibc malloc settings for CPU training
steps (transformer/backends/host_memory.py) and jax's persistent compilation cache
(transformer/backends/compile_cache.py). From Python,
``transformer.backends.host_memory.configure()`` applies the former before jax's first
computation.
"""
