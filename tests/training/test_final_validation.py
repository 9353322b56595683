"""The last step's checkpoint is saved before the final validation: a run stopped during that
validation keeps it, and the same command resumes there and validates again."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.subprocess_env import repo_env, xla_flags
from tests.tiny_run import SMALL, command_line

REPO = pathlib.Path(__file__).parents[2]

# Three runs (in this process: `train_and_evaluate`), each stopped by SIGINT during its final
# validation (after the validation loss, when the BLEU decode begins: a hook, not a race), then
# resumed and evaluated; then a fourth, the train command this time, stopped the same way ends
# the process, with the command's exit code.
SCRIPT = r"""
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
from tests.tiny_run import tiny_run_config
from transformer.commands import evaluate, train
from transformer.training import validation

*workdirs, last = sys.argv[1:5]
bleu = validation.Validation.bleu

def interrupted_bleu(self, params):
    os.kill(os.getpid(), signal.SIGINT)
    return bleu(self, params)

config = tiny_run_config(4)
config.train.checkpoint_every = 2
config.eval.bleu_every = 4
config.eval.bleu_max_examples = 2
config.eval.beam_size = 1  # the decode evaluate runs below: compiled once
for workdir in workdirs:
    validation.Validation.bleu = interrupted_bleu
    try:
        train.train_and_evaluate(config, workdir)
    except train.Interrupted as e:
        stopped = str(e)
    kept = sorted(int(s) for s in os.listdir(f'{workdir}/checkpoints') if s.isdigit())
    validation.Validation.bleu = bleu
    resumed = train.train_and_evaluate(config, workdir)['step']
    scores = evaluate.run(workdir, beam_size=1, max_examples=2, output=f'{workdir}/test.txt')
    print(json.dumps({'stopped': stopped, 'kept': kept, 'resumed': resumed,
                      'evaluated': scores['steps']}), flush=True)
validation.Validation.bleu = interrupted_bleu
train.cli(['train.py', f'--workdir={last}', *sys.argv[5:]])
"""


@pytest.mark.slow
def test_a_stop_during_the_final_validation_keeps_the_last_step_and_a_rerun_redoes_it(tmp_path):
    runs = [tmp_path / f'run{i}' for i in range(4)]
    # The fourth run: tiny_run_config(4) with the changes above, as flags.
    settings = {'train.num_steps': 4, 'train.checkpoint_every': 2, 'train.log_every': 1}
    settings |= {'train.eval_every': 0, 'eval.bleu_every': 4, 'eval.bleu_max_examples': 2}
    settings |= {'model.dropout_rate': 0.1, 'eval.beam_size': 1}
    flags = ['--config=configs/tiny.py', *command_line({**SMALL, **settings})]
    proc = subprocess.run(
        [sys.executable, '-c', SCRIPT, *map(str, runs), *flags],
        cwd=REPO,
        # One CPU device: what is checked does not depend on the number of devices, and one
        # device's programs compile faster (tests/compiles.py).
        env=repo_env(JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(1)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    # The process ends with the fourth stop: exit code 130, no crash on the way out.
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert 'Segmentation fault' not in proc.stderr and 'Fatal Python error' not in proc.stderr
    resume_line = 'Interrupted at step 4; the same command resumes from step 4 in {}/checkpoints.'
    assert proc.stderr.strip().splitlines()[-1] == resume_line.format(runs[3])
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{')]
    assert results == [
        {'stopped': resume_line.format(run), 'kept': [2, 4], 'resumed': 4, 'evaluated': [4]}
        for run in runs[:3]
    ]
    for run in runs[:3]:
        final = json.loads((run / 'final_metrics.json').read_text())
        assert final['step'] == 4 and final['steps_this_run'] == 0
        # The best-checkpoint record reflects the final validation, done once (the stopped
        # one wrote its loss, not its BLEU).
        assert final['best'] == {
            'step': 4,
            'score': final['validation_bleu']['sacrebleu'],
            'evals_since_best': 0,
        }
        assert (run / 'best' / '4').is_dir()
        records = [json.loads(r) for r in (run / 'metrics.jsonl').read_text().splitlines()]
        at_4 = [r for r in records if r['step'] == 4 and r.get('split') == 'validation']
        assert [('loss' in r, 'sacrebleu' in r) for r in at_4] == [
            (True, False),
            (True, False),
            (False, True),
        ]
