"""benchmarks/gpu_check.py: the failures it names, the variants it leaves out, and the whole
command on CPU with tiny settings (its figures are not results)."""

import json
import sys
from pathlib import Path

import pytest

from tests.tiny_run import SMALL

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'benchmarks'))

import gpu_check  # noqa: E402


@pytest.mark.slow
@pytest.mark.long
def test_gpu_check_runs_every_part_on_cpu(tmp_path):
    """Every part with tiny settings (a one-layer model of width 32): the six files,
    train_speed figures with XLA's temporaries, a kernel table from a real jax.profiler trace
    of the same run, a trained run's validation BLEU and the tests' exit code. One attention
    implementation: the part runs each as the same command (tests/model/test_flops.py runs
    train_speed.py itself)."""
    small = [f'{key}={value}' for key, value in SMALL.items() if key.startswith('model.')]
    summary = gpu_check.main(
        [f'--out={tmp_path}', '--train_speed_config=configs/tiny.py', '--dtype=float32']
        + ['--impls=einsum', '--profile_impl=einsum']
        + ['--train_speed_steps=2', '--train_speed_warmup=1', '--profile_steps=2']
        + ['--train_speed_set=data.max_len=32', '--train_speed_set=train.batch_size=8']
        + [f'--train_speed_set={setting}' for setting in small]
        + ['--multi30k_config=configs/tiny.py', '--multi30k_steps=4']
        + ['--multi30k_set=data.synthetic.num_train=200', '--eval_flags=--max_examples=4']
        + [f'--multi30k_set={setting}' for setting in small]
        + ['--tests=tests/model/test_masks.py::test_dense_mask_of_packed_causal_rows']
        + ['--test_workers=1']
    )
    files = {'summary.json', 'summary.md', 'train_speed.log', 'multi30k_train.log'}
    files |= {'multi30k_evaluate.log', 'tests.log'}
    assert {p.name for p in tmp_path.iterdir()} == files
    assert json.loads((tmp_path / 'summary.json').read_text()) == json.loads(json.dumps(summary))
    assert list(summary['train_speed']) == ['einsum']
    speed = summary['train_speed']['einsum']
    assert speed['attention_impl'] == 'einsum' and speed['ms_per_step'] > 0
    assert speed['temp_bytes'] > 0 and speed['batch_rows'] == 8
    kernels = summary['kernels']
    assert kernels['kernels'] >= 1 and kernels['ms_per_step'] > 0
    assert sum(k['share'] for k in kernels['kinds']) == pytest.approx(1.0)
    m = summary['multi30k']
    assert m['final_metrics']['step'] == 4
    assert 0 <= m['validation']['tokenized_bleu'] <= 100
    assert m['validation']['split'] == 'validation'
    assert summary['tests']['exit_code'] == 0 and '1 passed' in summary['tests']['summary']
    assert summary['tests']['failed'] == []
    table = (tmp_path / 'summary.md').read_text()
    assert '| einsum |' in table and '| matmul |' in table and '| configs/tiny.py | 4 |' in table


def test_failures_names_every_failed_test_once():
    log = (
        'F.E.\n'
        '=========================== short test summary info ============================\n'
        'FAILED tests/model/test_model.py::test_tied[all] - AssertionError: Not equal\n'
        'ERROR tests/test_api.py::test_load - RuntimeError: no GPU\n'
        'FAILED tests/model/test_model.py::test_tied[all] - AssertionError: Not equal\n'
        '2 failed, 1 error, 2 passed in 3.1s\n'
    )
    assert gpu_check.failures(log) == [
        'tests/model/test_model.py::test_tied[all]',
        'tests/test_api.py::test_load',
    ]
    assert gpu_check.failures('5 passed in 1.0s\n') == []
    stopped = (
        '[gw0] [ 10%] PASSED tests/test_a.py::test_one \n'
        '[gw1] [ 20%] FAILED tests/test_a.py::test_two[x] \n'
        '[gw0] [ 30%] ERROR tests/test_b.py::test_three \n'
    )
    assert gpu_check.failures(stopped) == [
        'tests/test_a.py::test_two[x]',
        'tests/test_b.py::test_three',
    ]


def test_variants_leave_out_what_is_the_default_on_this_backend():
    """On a CPU 'auto' attention is einsum and 'auto' embedding gradient the scatter, so those
    variants would time the default again; every other variant changes one setting."""
    import step_variants

    from transformer.backends import platform

    configs = step_variants.variant_configs('tiny', ['model.dtype=bfloat16'], None)
    default = configs.pop('default')
    assert default.model.dtype == 'bfloat16'
    resolved = {
        step_variants.VARIANTS[name] for name in step_variants.VARIANTS if name not in configs
    }
    for setting in resolved:
        key, value = setting.split('=')
        section, field = key.split('.')
        assert platform.resolve(field, value) == platform.resolve(field, default[section][field])
    for name, config in configs.items():
        key, value = step_variants.VARIANTS[name].split('=')
        section, field = key.split('.')
        assert str(config[section][field]) == value and config.model.dtype == 'bfloat16'
        changed = [k for k in ('model', 'train') if config[k] != default[k]]
        assert changed == [section], name


@pytest.mark.slow
@pytest.mark.long
def test_gpu_check_variants_on_cpu(tmp_path):
    """--variants end to end with one variant on CPU: its three files, both rows timed in every
    round, a change against the default, temporaries and a non-GEMM share from a trace."""
    summary = gpu_check.main(
        [f'--out={tmp_path}', '--variants', '--train_speed_config=configs/tiny.py']
        + ['--dtype=float32', '--train_speed_set=data.max_len=32']
        + [
            '--train_speed_set=train.batch_size=8',
            '--variant_flags=--variants dropout_prng=rbg '
            '--steps 2 --rounds 2 --profile_steps 1 --warmup 1',
        ]  # fmt: skip
    )
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {'summary.json', 'summary.md', 'variants.log', 'variants.json', 'variants.md'}
    rows = summary['variants']['variants']
    assert [r['variant'] for r in rows] == ['default', 'dropout_prng=rbg']
    assert rows[0]['change_vs_default'] == 0.0
    for r in rows:
        assert len(r['ms_rounds']) == 2 and r['ms_min'] <= r['ms_per_step'] <= r['ms_max']
        assert r['temp_bytes'] > 0 and 0 < r['non_gemm_share'] < 1
    assert '| dropout_prng=rbg |' in (tmp_path / 'summary.md').read_text()
