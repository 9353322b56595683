"""benchmarks/multi30k_device.sh, the GPU machine's sweep, run on the CPU up to the point where
it needs a GPU's time: with a 2-second deadline its one training is stopped before its first
update (the step alone takes longer to compile), so what is checked is the script itself: the
flags it gives multi30k_sweep.py, its recipes, the time plan from DEADLINE_S and RESERVE_S, the
table, the notes and what it copies to OUT. tests/benchmarks/test_multi30k_sweep.py runs the
sweep to its scores."""

import json
import os
import pathlib
import re
import subprocess
import sys

from tests.subprocess_env import REPO, repo_env


def test_device_script_plans_runs_and_copies_its_outputs(tmp_path):
    root, out, runs = tmp_path / 'root', tmp_path / 'out', tmp_path / 'runs'
    (root / '.m30k').mkdir(parents=True)  # raw files present: nothing is downloaded
    for stem in ('train', 'val', 'test2016'):
        for lang in ('en', 'de'):
            (root / '.m30k' / f'{stem}.{lang}').write_text('a b c\nd e f\n')
    (root / 'benchmarks').symlink_to(pathlib.Path(REPO) / 'benchmarks')
    out.mkdir()
    env = repo_env(RECIPES='tiny', SEEDS='0', DEADLINE_S='2', RESERVE_S='1', GRACE_S='6')
    env |= {'RUNS': str(runs), 'OUT': str(out)}
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env['PATH']  # its python3
    done = subprocess.run(
        ['bash', 'benchmarks/multi30k_device.sh'],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout.splitlines()
    assert done.returncode == 1, done.stderr[-2000:]
    assert said[0].startswith('multi30k_device.sh: RECIPES="tiny" SEEDS="0" DEADLINE_S=2')
    assert said[1].startswith('Time plan (D = 2 s, R = 1 s): trainings stopped at D - R = 1 s')
    # No update, no score; a compile time where the first SIGINT was lost (a KeyboardInterrupt
    # raised in jax's garbage-collection callback while it imports) and the second one came
    # after the compilation (benchmarks/sweep_jobs.run_all).
    rows = [line for line in said if line.startswith('| tiny |')]
    assert len(rows) == 1, said
    assert re.fullmatch(
        r'\| tiny \| 0 \| - \(deadline\) \| - \| (-|[\d.]+) \| - \| - \| - \|', rows[0]
    )
    assert 'error: no run was scored on validation' in done.stderr + done.stdout
    assert {p.name for p in out.iterdir()} == {'sweep.md', 'sweep.json', 'logs.tar.gz'}
    report = json.loads((out / 'sweep.json').read_text())
    assert report['seeds'] == [0] and list(report['recipes']) == ['tiny']
    assert report['stop_times_s'] == {'train': 1.0, 'validation': 1.7, 'test': 2.0}
    tiny = report['recipes']['tiny']
    assert tiny['config'] == 'configs/multi30k.py:tiny' and tiny['choice'] is None
    assert tiny['flags'] == [f'--config.data.manual_dir={root}/.m30k', '--config.eval.bleu_every=0']
