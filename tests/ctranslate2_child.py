"""CTranslate2 run in a process of its own: a test worker that holds jax (and torch, for the
MarianMT references) never also loads CTranslate2's runtime and its OpenMP library. A worker
holding all three was lost without a traceback now and then, at different tests each time.

    translate(directory, batch, beam_size=1)  -> [hypothesis tokens, ...] (the best of each)
    translate_scored(directory, batch, ...)   -> [(hypothesis tokens, its score), ...]
    score(directory, sources, targets)        -> [log-probs of each target token (+ </s>)]

Each test process starts one child, on its first request, and sends it every later one (a
request a line on its stdin, the answer a line on its stdout): the suite's score cases, one
per model option, would otherwise each start Python and import ctranslate2 again. A request
that raises is answered with its error, and the child serves the next; a child that died is
started again by the next request.
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import tempfile
from typing import Any

from tests.subprocess_env import repo_env

TIMEOUT_S = 300  # one request's answer

_CHILD = """
import json, sys, traceback
import ctranslate2
for line in sys.stdin:
    request = json.loads(line)
    try:
        translator = ctranslate2.Translator(
            request['directory'], compute_type=request['compute_type']
        )
        if request['method'] == 'translate_batch':
            results = translator.translate_batch(*request['args'], **request['kwargs'])
            answer = {'out': [r.hypotheses[0] for r in results]}
            if request['kwargs'].get('return_scores'):
                answer = {'out': [[r.hypotheses[0], r.scores[0]] for r in results]}
        else:
            results = translator.score_batch(*request['args'], **request['kwargs'])
            answer = {'out': [r.log_probs for r in results]}
        del translator
    except Exception:
        answer = {'error': traceback.format_exc()}
    sys.stdout.write(json.dumps(answer) + '\\n')
    sys.stdout.flush()
"""

_child: subprocess.Popen | None = None
_stderr = None  # the child's stderr, a file: a pipe nobody reads could fill and block it


def _started() -> subprocess.Popen:
    global _child, _stderr
    if _child is None or _child.poll() is not None:
        _stderr = tempfile.TemporaryFile(mode='w+')
        _child = subprocess.Popen(
            [sys.executable, '-c', _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=_stderr,
            env=repo_env(),
            text=True,
        )
    return _child


def _stop() -> None:
    if _child is not None and _child.poll() is None:
        _child.stdin.close()
        try:
            _child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _child.kill()


atexit.register(_stop)


def _stderr_tail() -> str:
    _stderr.seek(0)
    return _stderr.read()[-3000:]


def _run(directory, method: str, args: list, compute_type: str, kwargs: dict) -> list[Any]:
    request = {
        'directory': str(directory),
        'method': method,
        'args': args,
        'kwargs': kwargs,
        'compute_type': compute_type,
    }
    child = _started()
    child.stdin.write(json.dumps(request) + '\n')
    child.stdin.flush()
    if not select.select([child.stdout], [], [], TIMEOUT_S)[0]:
        child.kill()
        raise AssertionError(f'CTranslate2 gave no answer in {TIMEOUT_S} s: {_stderr_tail()}')
    line = child.stdout.readline()
    assert line, f'CTranslate2 ended ({child.wait()}): {_stderr_tail()}'
    answer = json.loads(line)
    assert 'error' not in answer, f'CTranslate2 failed: {answer.get("error", "")[-3000:]}'
    return answer['out']


def translate(directory, batch: list[list[str]], compute_type: str = 'default', **kwargs):
    """The best hypothesis (tokens) of each row of ``batch`` (`Translator.translate_batch`)."""
    return _run(directory, 'translate_batch', [batch], compute_type, kwargs)


def translate_scored(directory, batch: list[list[str]], **kwargs):
    """(tokens, score) of the best hypothesis of each row of ``batch``."""
    out = _run(directory, 'translate_batch', [batch], 'default', {**kwargs, 'return_scores': True})
    return [tuple(pair) for pair in out]


def score(directory, sources: list[list[str]], targets: list[list[str]], **kwargs):
    """Each target's per-token log-probabilities (`Translator.score_batch`)."""
    return _run(directory, 'score_batch', [sources, targets], 'default', kwargs)
