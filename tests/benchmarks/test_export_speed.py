"""benchmarks/export_speed.py end to end on the suite's tiny run: ours, CTranslate2 float32 and
int8 translate the same few sentences on the CPU (the figures of a 4-step model are not
results). Needs the export extra (torch, transformers, ctranslate2), as tests/test_export.py."""

import json

import pytest

from benchmarks import export_speed
from transformer import data, rundir

_SKIP = "{} is not installed: pip install -e '.[export]'"
for _module in ('torch', 'transformers', 'ctranslate2', 'safetensors'):
    pytest.importorskip(_module, reason=_SKIP.format(_module))

NAMES = ['ours', 'ctranslate2_float32', 'ctranslate2_int8']


@pytest.mark.slow
def test_export_speed_times_and_scores_ours_and_both_exports(run_dir, tmp_path, capsys):
    config = rundir.read_config(str(run_dir))
    sources, targets = data.load_text(config.data, config.data.test_split)
    (tmp_path / 'test.src').write_text('\n'.join(sources[:6]) + '\n')
    (tmp_path / 'test.ref').write_text('\n'.join(targets[:6]) + '\n')
    out = tmp_path / 'export_speed.json'
    export_speed.main(
        [f'--workdir={run_dir}', '--step=4', f'--source={tmp_path}/test.src']
        + [f'--reference={tmp_path}/test.ref', '--beam_size=2', '--batch_size=4']
        + ['--threads=1', f'--out={out}']
    )
    report = json.loads(out.read_text())
    assert report['steps'] == [4] and report['sentences'] == 6 and report['beam_size'] == 2
    assert report['model']['d_model'] == 32 and 'max_len' not in report['model']
    assert list(report['results']) == NAMES
    ours = report['results']['ours']
    assert ours['identical_to_ours'] == 6 and ours['first_run_seconds_with_compilation'] > 0
    for name in NAMES:
        result = report['results'][name]
        assert result['sentences_per_s'] == pytest.approx(6 / result['seconds'])
        assert 0 <= result['sacrebleu'] <= 100 and 0 <= result['tokenized_bleu'] <= 100
        assert 0 <= result['identical_to_ours'] <= 6 and result['mean_output_tokens'] >= 1
    assert report['results']['ctranslate2_int8']['compute_type'] == 'int8'
    printed = capsys.readouterr().out
    assert [line.split(':')[0].strip() for line in printed.splitlines()[-4:-1]] == NAMES
    assert printed.splitlines()[-1] == f'saved {out}'
