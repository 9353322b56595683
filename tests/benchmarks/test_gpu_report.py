"""benchmarks/gpu_report.py: summary.md of gpu_check.py, each part that ran and each part that
failed. gpu_check's own run on the CPU (tests/benchmarks/test_gpu_check.py) writes it from
real figures; here made-up summaries reach the branches a CPU run does not."""

from benchmarks import gpu_report


def test_failed_parts_are_rows_that_say_why():
    summary = {'device': 'gpu:H100', 'jax': '0.0'}
    summary['train_speed'] = {'fused': {'error': 'out of memory'}}
    summary['kernels'] = {'error': 'no trace'}
    summary['multi30k'] = {'config': 'configs/multi30k.py', 'steps': 0, 'error': 'data missing'}
    summary['tests'] = {'args': '-q', 'exit_code': 1, 'summary': '1 failed', 'failed': ['t::a']}
    summary['variants'] = {'error': 'timed out'}
    lines = gpu_report.markdown(summary).splitlines()
    assert lines[0] == '# gpu_check: gpu:H100, jax 0.0'
    assert '| fused | failed: out of memory | | | | | |' in lines
    assert 'Kernels: no table (no trace)' in lines
    assert '| configs/multi30k.py | 0 | 0 |  |  | data missing |  |' in lines
    assert 'Tests `pytest -q`: exit code 1, 1 failed' in lines and '- failed: `t::a`' in lines
    assert 'Variants: failed: timed out' in lines


def test_every_part_that_ran_is_a_table():
    kinds = [{'kind': 'matmul', 'ms_per_step': 30.0, 'share': 0.75}]
    top = [{'name': 'gemm', 'kind': 'matmul', 'ms_per_step': 30.0, 'share': 0.75}]
    top[0]['calls_per_step'] = 12
    summary = {
        'device': 'gpu:H100',
        'jax': '0.0',
        'train_speed': {
            'einsum': {'ms_per_step': 50.0, 'mfu': 0.2, 'tokens_per_s': 5e5, 'temp_bytes': None}
        },
        'kernels': {'device': 'H100', 'ms_per_step': 40.0, 'kinds': kinds, 'top': top},
        'multi30k': {
            'config': 'configs/multi30k.py:tiny',
            'steps': 8000,
            'train_s': 232.4,
            'steps_per_s': 34.42,
            'final_metrics': {'validation': {'perplexity': 4.567}},
            'validation': {'tokenized_bleu': 42.351, 'sacrebleu': 41.0},
        },
        'variants': {'table': '| variant | ms/step |'},
    }
    lines = gpu_report.markdown(summary).splitlines()
    assert '| einsum | 50.0 | 20.0% | 500,000 |  |  |  |' in lines  # no peer in this call
    assert 'Kernels (H100, 40.00 ms/step):' in lines and '| matmul | 30.000 | 75.0% |' in lines
    assert '| `gemm` | matmul | 30.000 | 75.0% | 12 |' in lines
    assert '| configs/multi30k.py:tiny | 8000 | 232 | 34.4 | 4.57 | 42.35 | 41.00 |' in lines
    assert '| variant | ms/step |' in lines and not any('Tests' in line for line in lines)
