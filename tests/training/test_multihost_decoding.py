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
def test_two_processes_validate_and_evaluate_as_one(tmp_path):
    """2 steps, validated (loss and BLEU) at step 2, as 2 processes x 4 devices; the same
    checkpoint validated again by 1 process x 8 devices (a copy of the run without its final
    metrics: the same command resumes at its last step, trains nothing and validates, as
    tests/training/test_final_validation.py shows; that 2 processes train as one is
    tests/training/test_multihost.py's): the same validation loss (1e-5) and BLEU (0.01), and
    both processes decide the best checkpoint one process decides. Then the 2-process run is
    evaluated by 2 processes and by one: the same hypotheses and scores, each process decoding
    about half of the sentences. Last, 2 processes translate stdin (process 0 reads it and
    writes the output): the lines of one process, a blank line kept blank."""
    config = _config('sharding', 2)
    config.eval.bleu_every = 2
    config.train.eval_every = 2
    # Validation decodes greedily: beam search across processes is the evaluate command's below
    # (validation scores with evaluate's score_eval_set).
    config.eval.beam_size = 1
    flags = _overrides(config, ['eval.beam_size'])
    worker = os.path.join('tests', 'multihost_worker.py')
    two = tmp_path / 'two'
    results = _run_two_processes(flags, two, script=worker)
    for code, out in results:
        assert code == 0, out[-3000:]
    decided = _results([out for _, out in results])
    assert len(decided) == 2 and decided[0] == decided[1] and decided[0]['best']['step'] == 2

    one = tmp_path / 'one'
    shutil.copytree(two, one)
    for name in (rundir.FINAL_METRICS_FILE, rundir.METRICS_FILE):
        (one / name).unlink()
    final = trainer.train_and_evaluate(config, str(one), devices=jax.devices('cpu'))
    assert final['steps_this_run'] == 0 and final['best']['step'] == 2
    got, want = _validation(two)[2], _validation(one)[2]
    np.testing.assert_allclose(got['loss'], want['loss'], rtol=1e-5)
    for metric in ('sacrebleu', 'tokenized_bleu', 'chrf', 'chrf++'):
        assert abs(got[metric] - want[metric]) <= 0.01, (metric, got, want)

    out = tmp_path / 'two.txt'
    flags = [f'--workdir={two}', '--beam_size=2', '--step=2', f'--output={out}']
    for code, output in _decode_two_processes('evaluate', flags):
        assert code == 0, output[-3000:]
    alone = evaluate.run(
        str(two), step=2, beam_size=2, output=str(tmp_path / 'one.txt'), devices=jax.devices('cpu')
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
    flags = [f'--workdir={two}', '--beam_size=1', '--step=2', f'--output={translated}']
    for code, output in _decode_two_processes('translate', flags, stdin=source):
        assert code == 0, output[-3000:]
    alone = api.load(str(two), step=2, devices=jax.devices('cpu')).translate(
        source.decode().splitlines(), beam_size=1
    )
    assert translated.read_text().splitlines() == alone and alone[1] == ''
