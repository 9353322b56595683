"""Test set-up: the suite's rules for precision and devices, quiet TensorFlow, a compilation
cache shared by the suite's processes, and one tiny trained run shared by the tests of the
commands that read a run directory. The variables must be set before jax (or tensorflow) is
first imported; the processes tests start inherit them.

The same ``pytest`` passes on a CPU machine and on a GPU machine (docs/testing.md):

- **float32 means float32.** XLA's default float32 matmul on NVIDIA GPUs rounds its inputs to
  TensorFloat-32 (about 3 decimal digits), on a CPU it does not. The suite runs every float32
  product at full float32 (``JAX_DEFAULT_MATMUL_PRECISION=float32``), so a float32 identity
  asserted at 1e-5 checks the same arithmetic on every platform. bfloat16 computations are
  not affected; a test of one states the tolerance of its dtype.
- **Devices are asked for.** 8 host CPU devices exist on every machine
  (``--xla_force_host_platform_device_count``); a test that needs several devices takes
  ``jax.devices('cpu')``, never the default backend's (a GPU machine's default is its GPU), and
  a process it starts for that is pinned to the CPU (``JAX_PLATFORMS=cpu``).
- **Platform behaviour is checked where it runs.** A test of what one platform does reads
  ``jax.default_backend()``, and covers the other branch by monkeypatching the backend's name;
  a test of a GPU kernel (tests/backends/test_gpu.py) is skipped, with its reason, without one.
- **The same program gives the same bits.** A resumed run is asserted equal to an uninterrupted
  one, bit for bit; on a GPU that holds only with XLA's deterministic ops
  (``--xla_gpu_deterministic_ops=true``: no atomic adds in scatters and reductions), which a CPU
  needs no flag for.
- **Programs are compiled for compiling fast.** The suite's programs are tiny and most are
  compiled once and run a few times: compiling them costs more than running them, so the
  backend compiler's optimizations are off (``--xla_backend_optimization_level=0``, LLVM's
  -O0; XLA's own graph passes still run). On 2 cores it cut the time of tests/decoding and
  tests/model by 29% (250 s to 178 s, ``pytest -n 2``); a comparison between two programs
  compiles both with it, so no tolerance changes. XLA's older CPU code generators
  (``--xla_cpu_use_fusion_emitters=false``) compile faster still, but with them an 8-device
  program's collectives sometimes wait on each other for good (one thread per product does
  not stop that), and ``NPROC=16``, which does, cost the suite the time they saved: the files
  that run commands slowed as much as the decoding and model files sped up
  (docs/experiments.md). So they compile the programs that cannot wait: a program of one CPU
  device, which holds no collective, is compiled by them in the test processes
  (tests/compiles.py; about 40% less compile time: docs/testing.md); a
  program of several devices keeps the default ones, and a test that states a tolerance for
  the default ones' arithmetic asks for them (``compiler_options=DEFAULT_GENERATORS``). A
  process a test starts with one CPU device (``tests/subprocess_env.xla_flags(1)``) compiles
  every program with them; one of several devices compiles as users do.
- On a GPU each process allocates device memory as it needs it
  (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), so that pytest-xdist workers and the processes tests
  start share the device.

The compilation cache: many tests train the same tiny model again (resume, kill-and-rerun,
other device counts, `train.py` subprocesses), and on CPU compiling its step costs more than
running it. jax's persistent cache, in a directory made for this test session and removed at
its end, lets every process of the session (pytest-xdist workers and the processes tests
start inherit the variables) reuse an executable compiled from the same program. Only
programs that took jax's default threshold (1 s) to compile are stored: caching every small
eager op as well made the tests that run many of them slower. A size limit turns on the
cache's file lock, so concurrent processes never read a half-written entry.
"""

import atexit
import os
import shutil
import tempfile

# Added to any XLA_FLAGS already set (pytest-xdist workers inherit the controller's).
_flags = os.environ.get('XLA_FLAGS', '').split()
for _flag in (
    '--xla_force_host_platform_device_count=8',
    '--xla_gpu_deterministic_ops=true',
    '--xla_backend_optimization_level=0',
):
    if not any(f.split('=')[0] == _flag.split('=')[0] for f in _flags):
        _flags.append(_flag)
os.environ['XLA_FLAGS'] = ' '.join(_flags)
os.environ.setdefault('JAX_DEFAULT_MATMUL_PRECISION', 'float32')
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# glibc's defaults in the test processes: the commands' malloc tuning (one arena, no mmap,
# transformer/backends/host_memory.py) applied in a worker that also runs torch (the MarianMT
# tests) lost that worker in 3 of 5 runs of tests/test_convert.py and its neighbours, and made
# them slower (95 s against 55-63 s); tests/backends/test_host_memory.py sets it itself.
os.environ.setdefault('TRANSFORMER_MALLOC', 'system')
# torch on one thread (its default is a thread per core): beside a jax computation or the other
# pytest-xdist worker, each of its small operations waited for a thread another process held
# (generate's greedy search of tests/test_export.py's 120 lines: 6-20 s on 2 busy cores, 0.7 s
# on one thread). The processes tests start inherit it.
os.environ.setdefault('OMP_NUM_THREADS', '1')
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix='transformer-tests-jax-cache-')
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache_dir
os.environ.setdefault('JAX_COMPILATION_CACHE_MAX_SIZE', str(2 << 30))

import pytest  # noqa: E402


@pytest.fixture(scope='session')
def run_dir(tmp_path_factory):
    """A tiny synthetic training run with checkpoints at steps 2 and 4: trained once for all
    pytest-xdist workers (tests/shared_dirs.py), and each test process given its own copy,
    which its tests may write into (evaluate's outputs, eval_sweep's table)."""
    from tests.shared_dirs import built_once
    from tests.tiny_run import tiny_run_config
    from transformer.commands import train as trainer

    def train(workdir):
        config = tiny_run_config(4)
        config.train.checkpoint_every = 2
        trainer.train_and_evaluate(config, str(workdir))

    workdir = tmp_path_factory.mktemp('run')
    shutil.copytree(built_once(tmp_path_factory, 'tiny_run', train), workdir, dirs_exist_ok=True)
    return workdir


@pytest.fixture(scope='session')
def fairseq_hf_dirs(tmp_path_factory):
    """Tiny NLLB-200, M2M100 and mBART-50 Hugging Face model directories
    (tests/fairseq_models.py), built once for all pytest-xdist workers; read them only."""
    from tests.fairseq_models import fairseq_models

    return fairseq_models(tmp_path_factory)


@pytest.fixture(scope='session')
def fairseq_runs(fairseq_hf_dirs, tmp_path_factory):
    """`fairseq_hf_dirs` converted to run directories, once for all workers; read them only."""
    from tests.fairseq_models import fairseq_runs

    return fairseq_runs(tmp_path_factory)


@pytest.fixture(scope='session')
def t5_hf_dirs(tmp_path_factory):
    """Tiny T5 v1.1, v1.0 and sharded v1.1 Hugging Face model directories (tests/t5_dirs.py),
    built once for all workers; read them only."""
    from tests.t5_dirs import t5_models

    return t5_models(tmp_path_factory)


@pytest.fixture(scope='session')
def t5_runs(t5_hf_dirs, tmp_path_factory):
    """`t5_hf_dirs` converted to run directories, once for all workers; read them only."""
    from tests.t5_dirs import t5_runs

    return t5_runs(tmp_path_factory)


@pytest.fixture(scope='session')
def lines_folder(tmp_path_factory):
    """A folder dataset of a few English-German lines (tests/fairseq_models.py), written once."""
    from tests.fairseq_models import lines_folder

    return lines_folder(tmp_path_factory)


def _named_backend(monkeypatch, name: str) -> None:
    import jax

    jax.clear_caches()  # nothing traced with another backend's choices is reused
    monkeypatch.setattr(jax, 'default_backend', lambda: name)


@pytest.fixture
def cpu_choices(monkeypatch):
    """The CPU's trace-time choices (`transformer.backends.platform`) on any machine: for a
    test of what the code does on a CPU; the computations still run on the default device."""
    import jax

    _named_backend(monkeypatch, 'cpu')
    yield
    jax.clear_caches()


def pytest_configure(config):
    """Under pytest-xdist (``-n``), hand each worker whole files (``--dist loadfile``, unless
    ``--dist`` is given): a file's module fixtures are then built by one worker, where two
    workers on one file each built them, or one waited for the other's `built_once` build
    (tests/test_export.py's two setups: 20 s each). With ``--dist load``, one test at a time
    (``--maxschedchunk=1`` unless given): with the slow files first
    (`pytest_collection_modifyitems`), xdist's default first chunks (a quarter of each
    worker's share) would give one worker most of them.
    Then one-device programs are compiled by XLA's older code generators (module docstring)."""
    named = any(arg.startswith('--dist') for arg in config.invocation_params.args)
    if getattr(config.option, 'dist', 'no') == 'load' and not named:
        config.option.dist = 'loadfile'
    if getattr(config.option, 'maxschedchunk', False) is None:
        config.option.maxschedchunk = 1
    from tests.compiles import compile_one_device_programs_with_older_generators

    compile_one_device_programs_with_older_generators()


def pytest_collection_modifyitems(config, items):
    """The files that hold slow tests first, in their order, then the rest: run in parallel,
    the last files are short ones, so no worker waits for another's minute-long file at the
    end. Each file's tests stay next to each other, in their order."""
    slow = {item.path for item in items if item.get_closest_marker('slow')}
    items.sort(key=lambda item: item.path not in slow)


def pytest_collection_finish(session):
    """The objects that exist once the test modules are imported (jax, flax, tensorflow and
    the tests themselves, most of a test process's heap) live as long as it does: frozen
    (`gc.freeze`), Python's full collections no longer walk them. In tests/training/
    test_trainer.py and tests/evaluation/test_evaluate.py it halved the time full collections
    took (4.2 s to 2.0 s in 110 s, from `gc.callbacks`)."""
    import gc

    gc.collect()
    gc.freeze()
