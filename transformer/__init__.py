"""The encoder-decoder Transformer of "Attention Is All You Need", trained for translation.

Importing the package keeps a CPU training step's buffers mapped between steps (glibc malloc
settings, transformer/host_memory.py; ``TRANSFORMER_MALLOC=system`` opts out).
"""

from transformer import host_memory

host_memory.configure()
