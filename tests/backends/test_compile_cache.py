"""jax's persistent compilation cache: where the commands put it, and when they do not."""

import importlib.util
import os
import re
import subprocess
import sys

import jax
import pytest

from tests.subprocess_env import xla_flags
from transformer.backends import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_cache_dir(monkeypatch):
    """This process as a command sees it without JAX_COMPILATION_CACHE_DIR (conftest sets one
    for the suite); jax's settings are put back afterwards."""
    saved = jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size
    jax.config.update('jax_compilation_cache_dir', None)
    jax.config.update('jax_compilation_cache_max_size', -1)
    for name in (compile_cache.ENV_VAR, 'XDG_CACHE_HOME'):
        monkeypatch.delenv(name, raising=False)
    yield
    jax.config.update('jax_compilation_cache_dir', saved[0])
    jax.config.update('jax_compilation_cache_max_size', saved[1])


def test_default_directory_is_per_cpu_under_xdg_cache_home(no_cache_dir, monkeypatch, tmp_path):
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    path = compile_cache.configure()
    assert path == str(tmp_path / 'transformer' / 'jax' / compile_cache.host_tag())
    assert os.path.isdir(path) and jax.config.jax_compilation_cache_dir == path
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES


def test_environment_chooses_the_directory_or_turns_it_off(no_cache_dir, monkeypatch, tmp_path):
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    monkeypatch.setenv(compile_cache.ENV_VAR, 'off')
    assert compile_cache.configure() is None
    assert jax.config.jax_compilation_cache_dir is None and not (tmp_path / 'xdg').exists()

    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / 'mine'))
    jax.config.update('jax_compilation_cache_max_size', 1 << 20)  # the user's own limit stays
    assert compile_cache.configure() == str(tmp_path / 'mine')
    assert (tmp_path / 'mine').is_dir() and not (tmp_path / 'xdg').exists()
    assert jax.config.jax_compilation_cache_max_size == 1 << 20


def test_without_filelock_the_cache_is_unlimited_not_broken(no_cache_dir, monkeypatch, tmp_path):
    """jax raises at the first compilation when asked for a limit it cannot keep (it locks the
    cache with filelock): then the cache is on, without the limit."""
    find_spec = importlib.util.find_spec

    def without_filelock(name, *args):
        return None if name == 'filelock' else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, 'find_spec', without_filelock)
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / 'cache'))
    assert compile_cache.configure() == str(tmp_path / 'cache')
    assert jax.config.jax_compilation_cache_max_size == -1


def test_jax_own_setting_wins(no_cache_dir, monkeypatch, tmp_path):
    jax.config.update('jax_compilation_cache_dir', str(tmp_path / 'jax'))
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / 'ours'))
    assert compile_cache.configure() == str(tmp_path / 'jax')
    assert not (tmp_path / 'ours').exists()


def test_a_directory_that_cannot_be_made_is_a_warning(no_cache_dir, monkeypatch, tmp_path, caplog):
    (tmp_path / 'file').write_text('not a directory')
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / 'file' / 'cache'))
    assert compile_cache.configure() is None
    assert jax.config.jax_compilation_cache_dir is None
    warned = [r.getMessage() for r in caplog.records if 'No compilation cache' in r.getMessage()]
    assert len(warned) == 1 and compile_cache.ENV_VAR in warned[0] and '\n' not in warned[0]


def test_host_tag_follows_the_cpu_model_and_flags_not_its_clock(tmp_path):
    def tag(model, flags, mhz):
        info = tmp_path / f'cpuinfo_{model}_{flags}_{mhz}'
        second = 'processor\t: 1\nmodel name\t: other\nflags\t\t: none\n'
        info.write_text(
            f'processor\t: 0\nmodel name\t: {model}\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n'
            f'\n{second}'
        )
        return compile_cache.host_tag(str(info))

    base = tag('EPYC', 'sse avx2', 2000)
    assert re.fullmatch(r'[^-/]+-[0-9a-f]{12}', base)
    assert tag('EPYC', 'sse avx2', 3100) == base  # the clock is not an instruction set
    assert tag('EPYC', 'sse avx2 avx512f', 2000) != base
    assert tag('Xeon', 'sse avx2', 2000) != base
    assert compile_cache.host_tag() == compile_cache.host_tag()  # this machine's, stable


@pytest.mark.slow
def test_translate_command_fills_the_default_cache_and_loads_from_it(run_dir, tmp_path):
    """A command run with no cache setting writes its compiled decoding loop under
    $XDG_CACHE_HOME/transformer/jax/<host>; the next run loads it from there (jax reports the
    hit) and translates exactly as a run with the cache off."""
    env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
    env.pop(compile_cache.ENV_VAR, None)
    # Every program, however fast it compiled (jax keeps only those over 1 s by default), and
    # jax's report of each cache hit as a warning line.
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
    env['JAX_LOG_COMPILES'] = '1'
    env['XDG_CACHE_HOME'] = str(tmp_path / 'xdg')
    # One CPU device: the cache works alike for any number, and its programs compile faster.
    env['XLA_FLAGS'] = xla_flags(1)
    # Greedy: a smaller program than the config's beam search, cached and loaded the same way.
    command = [sys.executable, '-m', 'transformer.translate', f'--workdir={run_dir}']
    command.append('--beam_size=1')
    runs = {}
    for name, extra in (
        ('first', {}),
        ('second', {}),
        ('off', {compile_cache.ENV_VAR: 'off'}),
    ):
        done = subprocess.run(
            command,
            input='a b c\nd e\n',
            env=env | extra,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        hits = re.findall(r"Persistent compilation cache hit for '([^']*)'", done.stderr)
        runs[name] = done.stdout, [program for program in hits if 'search' in program]
    assert runs['first'][1] == [] and runs['off'][1] == []
    assert runs['second'][1], 'the second run compiled its search again'
    outputs = {out for out, _ in runs.values()}
    assert len(outputs) == 1 and len(runs['first'][0].splitlines()) == 2
    hosts = os.listdir(tmp_path / 'xdg' / 'transformer' / 'jax')
    assert hosts == [compile_cache.host_tag()]
    entries = os.listdir(tmp_path / 'xdg' / 'transformer' / 'jax' / hosts[0])
    assert any('search' in name for name in entries), entries


def test_eval_sweep_turns_the_cache_on_before_anything_else(monkeypatch, tmp_path):
    """benchmarks/eval_sweep.py does not run through `console.run`, so it opens the cache
    itself, first: a rerun of a sweep loads its decoding programs."""
    from benchmarks import eval_sweep

    calls = []
    monkeypatch.setattr(compile_cache, 'configure', lambda: calls.append('configure'))
    with pytest.raises(SystemExit, match='error: '):
        eval_sweep.main(['--workdir', str(tmp_path / 'no_run')])
    assert calls == ['configure']
