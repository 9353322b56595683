"""The programs XLA compiles while a block runs, read from jax's compile events, and the code
generators the suite compiles them with."""

import contextlib

import jax
import numpy as np

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


OLDER_GENERATORS_FLAG = 'xla_cpu_use_fusion_emitters'
# jax.jit's compiler_options for a program that must be compiled by the default generators.
DEFAULT_GENERATORS = {OLDER_GENERATORS_FLAG: True}


def compile_one_device_programs_with_older_generators() -> None:
    """From now on in this process, compiles every program of one CPU device with XLA's older
    CPU code generators (the docstring of tests/conftest.py says why), unless the program's
    own ``compiler_options`` name the flag.

    It wraps jax's `compile_or_get_cached`, which every jit and pmap program passes through
    with its devices and compile options. The persistent cache's key includes the options, so
    no process reads a program compiled by the other generators. tests/test_suite_compiles.py
    checks that each kind of program gets the generators meant for it."""
    from jax._src import compiler

    compile_or_get_cached = compiler.compile_or_get_cached

    def compile_with_older_generators(backend, computation, devices, options, *args, **kwargs):
        named = any(key == OLDER_GENERATORS_FLAG for key, _ in options.env_option_overrides)
        if backend.platform == 'cpu' and np.size(devices) == 1 and not named:
            options.env_option_overrides = [
                *options.env_option_overrides,
                (OLDER_GENERATORS_FLAG, False),
            ]
        return compile_or_get_cached(backend, computation, devices, options, *args, **kwargs)

    compiler.compile_or_get_cached = compile_with_older_generators
