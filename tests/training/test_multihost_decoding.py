"""Decoding over processes: validation (loss and BLEU), the evaluate and translate commands
run as 2 processes x 4 devices, each process decoding its rows, against 1 process x 8 devices.

The processes are real (`python train.py`, `python -m transformer.evaluate` and `translate`,
twice each, joined by jax.distributed on localhost), started and always ended by the test
(the launchers of tests/training/test_multihost.py and of this file).
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.subprocess_env import repo_env, xla_flags
from tests.tiny_run import DECODE_BATCH
from tests.training.test_multihost import (
    REPO,
    _config,
    _free_port,
    _overrides,
    _results,
    _run_two_processes,
)
from transformer import api, rundir
from transformer.commands import evaluate
from transformer.commands import train as trainer


def _validation(run_dir) -> dict[int, dict]:
    """{step: the validation record's loss and BLEU} of ``metrics.jsonl``."""
    found: dict[int, dict] = {}
    for line in open(os.path.join(run_dir, 'metrics.jsonl')):
        record = json.loads(line)
        if record['split'] == 'validation':
            found.setdefault(record['step'], {}).update(record)
    return found


def _decode_two_processes(command, flags, stdin=b'', timeout=240) -> list[tuple[int, str]]:
    """``python -m transformer.COMMAND`` as processes 0 and 1 (4 CPU devices each), ``stdin``
    given to process 0 alone: (exit code, stdout + stderr) of each."""
    env = repo_env(XLA_FLAGS=xla_flags(4), JAX_PLATFORMS='cpu')
    port = _free_port()
    base = [sys.executable, '-m', f'transformer.{command}', *flags]
    base += [f'--coordinator_address=localhost:{port}', '--num_processes=2']
    procs = []
    try:
        for pid in (0, 1):
            procs.append(
                subprocess.Popen(
                    [*base, f'--process_id={pid}'],
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        outputs = [
            p.communicate(stdin if pid == 0 else b'', timeout=timeout)[0].decode()
            for pid, p in enumerate(procs)
        ]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


@pytest.mark.slow
def test_two_processes_validate_and_evaluate_as_one(run_dir, tmp_path):
    """Conftest's tiny run (4 steps, one process) without its final metrics, copied twice:
    the same command resumes at its last step, trains nothing and validates (loss and BLEU),
    as tests/training/test_final_validation.py shows, once as 2 processes x 4 devices and
    once as 1 process x 8 devices: the same validation loss (1e-5) and BLEU (0.01), and both
    processes decide the best checkpoint one process decides (that 2 processes train as one
    is tests/training/test_multihost.py's). Then the run is evaluated by 2 processes and by
    one: the same hypotheses and scores, each process decoding about half of the sentences.
    Last, 2 processes translate stdin (process 0 reads it and writes the output): the lines
    of one process, a blank line kept blank."""
    config = _config('sharding', 4)  # conftest's run, which checkpoints every 2 steps
    config.eval.bleu_every = 4
    # Validation decodes greedily: beam search across processes is the evaluate command's below
    # (validation scores with evaluate's score_eval_set). Batches of DECODE_BATCH rows (the
    # validation BLEU's 8 sentences in one) compile one search loop, not one per stage.
    config.eval.beam_size = 1
    config.eval.batch_size = config.eval.bleu_max_examples = DECODE_BATCH
    flags = _overrides(config, ['eval.beam_size', 'eval.bleu_max_examples'])
    two, one = tmp_path / 'two', tmp_path / 'one'
    for copy in (two, one):
        shutil.copytree(run_dir, copy)
        for name in (rundir.FINAL_METRICS_FILE, rundir.METRICS_FILE):
            (copy / name).unlink()
    worker = os.path.join('tests', 'multihost_worker.py')
    results = _run_two_processes(flags, two, script=worker)
    for code, out in results:
        assert code == 0, out[-3000:]
    decided = _results([out for _, out in results])
    assert len(decided) == 2 and decided[0] == decided[1] and decided[0]['best']['step'] == 4

    final = trainer.train_and_evaluate(config, str(one), devices=jax.devices('cpu'))
    assert final['steps_this_run'] == 0 and final['best']['step'] == 4
    got, want = _validation(two)[4], _validation(one)[4]
    np.testing.assert_allclose(got['loss'], want['loss'], rtol=1e-5)
    for metric in ('sacrebleu', 'tokenized_bleu', 'chrf', 'chrf++'):
        assert abs(got[metric] - want[metric]) <= 0.01, (metric, got, want)

    out = tmp_path / 'two.txt'
    flags = [f'--workdir={two}', '--beam_size=2', '--step=4', f'--output={out}']
    for code, output in _decode_two_processes('evaluate', flags):
        assert code == 0, output[-3000:]
    alone = evaluate.run(
        str(two), step=4, beam_size=2, output=str(tmp_path / 'one.txt'), devices=jax.devices('cpu')
    )
    assert out.read_text() == (tmp_path / 'one.txt').read_text()
    scores = json.loads(out.with_suffix('.json').read_text())
    assert scores['sacrebleu'] == alone['sacrebleu'] and scores['chrf'] == alone['chrf']
    assert (scores['devices'], scores['processes']) == (8, 2)
    per_process = scores['sentences_per_process']
    assert len(per_process) == 2 and sum(per_process) == scores['num_sentences'] == 20
    assert min(per_process) >= sum(per_process) // 3  # about half each (12 and 8 here)
    assert alone['sentences_per_process'] == [20]

    # translate: process 0 reads stdin and broadcasts it, and alone writes the output.
    hypotheses = (tmp_path / 'one.txt').read_text().splitlines()
    source = ''.join(f'{line}\n' for line in ['dinds bap koft .', '', *hypotheses[:5]]).encode()
    translated = tmp_path / 'translated.txt'
    flags = [f'--workdir={two}', '--beam_size=1', '--step=4', f'--output={translated}']
    for code, output in _decode_two_processes('translate', flags, stdin=source):
        assert code == 0, output[-3000:]
    alone = api.load(str(two), step=4, devices=jax.devices('cpu')).translate(
        source.decode().splitlines(), beam_size=1
    )
    assert translated.read_text().splitlines() == alone and alone[1] == ''
