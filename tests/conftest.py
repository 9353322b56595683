"""Test set-up: 8 host CPU devices so that pmap and sharding are testable, quiet TensorFlow.

Both variables must be set before jax (or tensorflow) is first imported.
"""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
