"""Device- and host-specific settings, one file each, named for what it does: how the
model's products are laid out on CPUs (products.py), glibc's malloc for CPU training
(host_memory.py), jax's persistent compilation cache (compile_cache.py), and host reads that
raise a failed computation's error instead of waiting (fetch.py). The model and the commands
call them; nothing here knows the model."""
