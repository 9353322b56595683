"""The programs XLA compiles while a block runs, read from jax's compile events."""

import contextlib

import jax

COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


@contextlib.contextmanager
def compiled_programs():
    """Yields a list that receives the name of each program compiled inside the block (jax's
    ``fun_name``, e.g. 'jit(train_step)'), in order."""
    names = []

    def count(event, duration, **kwargs):
        if event == COMPILE_EVENT:
            names.append(kwargs.get('fun_name', ''))

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
