"""benchmarks/kernel_time.py: the kernels of a hand-made trace, by name and kind."""

import gzip
import json

import pytest

from benchmarks import kernel_time


def _event(name, dur, pid=1, tid=10, **args):
    return {'ph': 'X', 'pid': pid, 'tid': tid, 'ts': 0, 'dur': dur, 'name': name, 'args': args}


def _meta(kind, pid, name, tid=None):
    event = {'ph': 'M', 'pid': pid, 'name': f'{kind}_name', 'args': {'name': name}}
    return event if tid is None else event | {'tid': tid}


def test_kernel_kinds_by_name():
    kinds = {
        'nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT': 'matmul',
        'gemm_fusion_dot_3': 'matmul',
        'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas': 'matmul',
        'cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16': 'attention',
        'flash_fprop': 'attention',
        'input_scatter_fusion_1': 'scatter',
        'input_reduce_fusion_36': 'reduction',
        'loop_add_fusion_23': 'elementwise',
        'loop_transpose_fusion_2': 'copy/transpose',
        'MemcpyD2D': 'copy/transpose',
        'ynn_fusion.12': 'matmul',
        'some_custom_kernel': 'other',
    }
    assert {name: kernel_time.kernel_kind(name) for name in kinds} == kinds


def test_kernel_table_of_a_gpu_trace():
    """Only the first GPU's stream events count (host events, the derived 'XLA Ops' line and a
    second GPU do not); per-step times, shares summing to 1, the longest kernel first."""
    trace = {
        'traceEvents': [
            _meta('process', 1, '/device:GPU:0'),
            _meta('thread', 1, 'Stream #13(Compute)', tid=10),
            _meta('thread', 1, 'XLA Ops', tid=11),
            _meta('process', 2, '/host:CPU'),
            _meta('process', 3, '/device:GPU:1'),
            _event('nvjet_tst_128x256', 600.0),
            _event('nvjet_tst_128x256', 600.0),
            _event('cudnn_generated_sdpa_flash_fprop', 300.0),
            _event('input_reduce_fusion_36', 200.0),
            _event('loop_add_fusion_2', 100.0),
            _event('input_scatter_fusion_1', 150.0),
            _event('MemcpyD2H', 50.0),
            _event('fusion.12', 5000.0, tid=11),  # the XLA Ops line repeats the kernels
            _event('PjitFunction(train_step)', 9000.0, pid=2),
            _event('nvjet_tst_128x256', 9000.0, pid=3),
        ]
    }
    table = kernel_time.kernel_table(trace, steps=2)
    assert table['device'] == 'gpu' and table['kernels'] == 6
    assert table['ms_per_step'] == pytest.approx(2.0 / 2)
    kinds = {k['kind']: k for k in table['kinds']}
    assert [k['kind'] for k in table['kinds']] == list(kernel_time.KINDS)
    assert kinds['matmul']['ms_per_step'] == pytest.approx(0.6)
    assert kinds['matmul']['share'] == pytest.approx(0.6)
    assert kinds['attention']['share'] == pytest.approx(0.15)
    assert kinds['copy/transpose']['share'] == pytest.approx(0.025)
    assert kinds['other']['share'] == 0
    assert sum(k['share'] for k in table['kinds']) == pytest.approx(1.0)
    top = table['top'][0]
    assert (top['name'], top['kind'], top['calls_per_step']) == ('nvjet_tst_128x256', 'matmul', 1)


def test_kernel_table_of_a_cpu_trace_counts_xla_thunks():
    """On CPU the kernels are the events with an hlo_op argument (not the 'end:' markers nor
    the runtime's own events); an empty trace gives zero shares, not an error."""
    trace = [
        _meta('process', 1, '/host:CPU'),
        _event('ynn_fusion.2', 70.0, hlo_op='ynn_fusion.2'),
        _event('end: ynn_fusion.2', 0.2),
        _event('wrapped_scatter', 30.0, hlo_op='wrapped_scatter'),
        _event('ThunkExecutor::Execute (wait for completion)', 500.0),
    ]
    table = kernel_time.kernel_table(trace, steps=1)
    assert table['device'] == 'cpu' and table['ms_per_step'] == pytest.approx(0.1)
    assert [t['kind'] for t in table['top']] == ['matmul', 'scatter']
    empty = kernel_time.kernel_table({'traceEvents': []}, steps=1)
    assert empty['kernels'] == 0 and all(k['share'] == 0 for k in empty['kinds'])


def test_load_trace_reads_the_perfetto_file_under_the_trace_directory(tmp_path):
    run = tmp_path / 'plugins' / 'profile' / '2026_11_26_08_00_00'
    run.mkdir(parents=True)
    with gzip.open(run / 'perfetto_trace.json.gz', 'wt') as f:
        json.dump({'traceEvents': [_meta('process', 1, '/host:CPU')]}, f)
    assert kernel_time.load_trace(str(tmp_path))['traceEvents'][0]['args'] == {'name': '/host:CPU'}
    with pytest.raises(FileNotFoundError, match='no .*trace.json.gz'):
        kernel_time.load_trace(str(tmp_path / 'plugins' / 'none'))
