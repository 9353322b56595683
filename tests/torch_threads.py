"""torch on one thread in the test modules that run Hugging Face's torch models beside jax.

torch's CPU operations run on as many threads as the machine has cores by default: beside a
jax computation or another pytest-xdist worker, each of its small operations waits for a
thread that another process holds. On 2 busy cores, generate's greedy search of 120 lines of
tests/test_export.py's model took 6-20 s on torch's 2 threads and 0.7 s on one. A module
imports the fixture (autouse), which gives the process its threads back after the module."""

import pytest


@pytest.fixture(scope='module', autouse=True)
def torch_on_one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
