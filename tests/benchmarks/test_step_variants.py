"""The GPU step variants' benchmark parts, on a CPU: the PyTorch peer at tiny shapes and
without torch, the XLA flag check, and what step_variants leaves out off a GPU (its figures are
not results)."""

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'benchmarks'))

import step_variants  # noqa: E402
import torch_peer  # noqa: E402
import xla_flags  # noqa: E402


@pytest.mark.slow
def test_torch_peer_smoke_trains_at_tiny_shapes(tmp_path):
    """One eager step of the tiny peer on the CPU: a time, the slots, and a first loss near
    log(V) (random initialisation, label smoothing 0.1), written to --out."""
    pytest.importorskip('torch')
    out = tmp_path / 'peer.json'
    argv = ['--smoke', '--modes=eager', '--steps=1', '--rounds=1', '--warmup=1', f'--out={out}']
    report = torch_peer.main(argv)
    eager = report['modes']['eager']
    assert eager['ms_per_step'] > 0 and eager['slots_per_step'] == 4 * 16
    assert abs(eager['loss'] - math.log(torch_peer.SMOKE['vocab'])) < 1.5
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))


def test_torch_peer_without_torch_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, 'torch', None)  # import torch raises ImportError
    report = torch_peer.main(['--smoke', '--modes=eager'])
    assert report == {'error': 'torch is not installed: no PyTorch peer (pip install torch)'}
    assert capsys.readouterr().out.strip() == report['error']


def test_torch_peer_reads_the_shapes_of_a_config():
    shapes = torch_peer.config_shapes('configs/base.py', ['train.batch_size=8'])
    assert shapes['rows'] == 8 and shapes['length'] == 256 and shapes['vocab'] == 37000
    assert (shapes['d_model'], shapes['heads'], shapes['d_ff']) == (512, 8, 2048)
    assert shapes['encoder_layers'] == shapes['decoder_layers'] == 6
    with pytest.raises(SystemExit, match="--modes takes 'eager' and 'compile', not jit"):
        torch_peer.main(['--smoke', '--modes=jit'])


@pytest.mark.slow
def test_xla_flag_check_accepts_known_flags_and_names_unknown_ones():
    """Each flag set of `step_variants.FLAG_SETS` starts jax here; a made-up flag does not,
    and the check returns XLA's line naming it."""
    assert xla_flags.known(' '.join(step_variants.FLAG_SETS.values())) is None
    said = xla_flags.known('--xla_gpu_no_such_flag=true')
    assert 'Unknown flag' in said and '--xla_gpu_no_such_flag' in said


def test_flag_sets_and_peer_are_left_out_off_a_gpu_with_a_line():
    args = argparse.Namespace(flags=list(step_variants.FLAG_SETS), peer=True, reserve_s=0.0)
    report = {'variants': [{'variant': 'default', 'ms_per_step': 1.0}]}
    if step_variants.jax.default_backend() == 'gpu':
        pytest.skip('a GPU runs them (the children would be timed, not left out)')
    step_variants.run_children(args, report)
    assert len(report['variants']) == 1
    assert len(report['left_out']) == len(step_variants.FLAG_SETS) + 1
    assert all('runs on a GPU only' in line for line in report['left_out'])


def test_tables_read_each_row_as_ours_over_torch_compile():
    """gpu_check's and step_variants' tables divide each row's ms/step by the peer's
    torch.compile figure of the same report (made-up figures: only the arithmetic is tested)."""
    import gpu_check

    speed = {'ms_per_step': 40.0, 'mfu': 0.29, 'tokens_per_s': 1e5, 'temp_bytes': 2**20}
    summary = {'device': 'gpu:H200', 'jax': '0', 'train_speed': {'fused': speed}}
    summary['peer'] = {'modes': {'compile': {'ms_per_step': 32.0}}}
    assert '| fused | 40.0 | 29.0% | 100,000 | 1 |  | 1.25 |' in gpu_check.markdown(summary)
    row = {'variant': 'default', 'ms_per_step': 30.0, 'ms_min': 29.0, 'ms_max': 31.0}
    row |= {'mfu': 0.3, 'change_vs_default': 0.0, 'temp_bytes': None, 'compile_s': 9.0}
    report = {'config': 'c', 'settings': [], 'device': 'gpu:H200', 'jax': '0', 'batch_rows': 2}
    report |= {'max_len': 8, 'rounds': 1, 'steps_per_round': 1, 'default_resolves': {}}
    report |= {'variants': [row], 'peer': {'impl': 'torch_compile', 'ms_per_step': 24.0}}
    report['left_out'] = ['flags=x (--xla_x): Unknown flag in XLA_FLAGS: --xla_x']
    table = step_variants.markdown(report)
    assert '| 9 | 1.25 |' in table and '- flags=x (--xla_x): Unknown flag' in table
