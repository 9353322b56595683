"""CTranslate2 run in a process of its own: a test worker that holds jax (and torch, for the
MarianMT references) never also loads CTranslate2's runtime and its OpenMP library. A worker
holding all three was lost without a traceback now and then, at different tests each time.

    translate(directory, batch, beam_size=1)  -> [hypothesis tokens, ...] (the best of each)
    score(directory, sources, targets)        -> [log-probs of each target token (+ </s>)]
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.subprocess_env import repo_env

_CHILD = """
import json, sys
import ctranslate2
request = json.load(sys.stdin)
translator = ctranslate2.Translator(request['directory'], compute_type=request['compute_type'])
if request['method'] == 'translate_batch':
    results = translator.translate_batch(*request['args'], **request['kwargs'])
    out = [r.hypotheses[0] for r in results]
else:
    results = translator.score_batch(*request['args'], **request['kwargs'])
    out = [r.log_probs for r in results]
json.dump(out, sys.stdout)
"""


def _run(directory, method: str, args: list, compute_type: str, kwargs: dict) -> list[Any]:
    request = {
        'directory': str(directory),
        'method': method,
        'args': args,
        'kwargs': kwargs,
        'compute_type': compute_type,
    }
    done = subprocess.run(
        [sys.executable, '-c', _CHILD],
        input=json.dumps(request),
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f'CTranslate2 failed ({done.returncode}): {done.stderr[-3000:]}'
    return json.loads(done.stdout)


def translate(directory, batch: list[list[str]], compute_type: str = 'default', **kwargs):
    """The best hypothesis (tokens) of each row of ``batch`` (`Translator.translate_batch`)."""
    return _run(directory, 'translate_batch', [batch], compute_type, kwargs)


def score(directory, sources: list[list[str]], targets: list[list[str]], **kwargs):
    """Each target's per-token log-probabilities (`Translator.score_batch`)."""
    return _run(directory, 'score_batch', [sources, targets], 'default', kwargs)
