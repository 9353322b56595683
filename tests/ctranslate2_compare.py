"""CTranslate2's outputs of an export against ours, for the export tests of each family
(tests/test_export_ctranslate2_fairseq.py, test_export_ctranslate2_t5.py): teacher-forced
log-probabilities against its ``score_batch``, greedy search and beam 4 against its
``translate_batch`` (tests/ctranslate2_child.py runs it).

Our beam search is set as CTranslate2's by the caller (length^1 with 'fairseq', ``renormalize``:
CTranslate2 takes log-probabilities over the tokens allowed) and CTranslate2 searches to the
limit (``patience``: it otherwise stops once ``beam_size`` hypotheses have ended). One rule
still differs: ours offers </s> to every live hypothesis at each step (as Tensor2Tensor's),
CTranslate2 only where </s> is among the K best candidates, so ours may end a hypothesis
CTranslate2 never ends, with a higher score (their live hypotheses are the same K).
"""

import struct
import subprocess
import sys
from collections.abc import Callable

import jax
import numpy as np

from tests import ctranslate2_child
from tests.subprocess_env import repo_env
from transformer import decoding
from transformer.model import teacher_forced_logits

BEAM = 4


def convert_in_child(script: str, pairs: list[str]) -> None:
    """``python -c script`` on (source, out) ``pairs`` (CTranslate2's converter, which imports
    torch, transformers and ctranslate2: once for all of them); AssertionError with its
    stderr if it fails."""
    done = subprocess.run(
        [sys.executable, '-c', script, *pairs], env=repo_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


# model.bin's data types, in CTranslate2's order (include/ctranslate2/types.h).
_DTYPES = ('float32', 'int8', 'int16', 'int32', 'float16', 'bfloat16')


def read_model_bin(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({variable: array}, {alias: variable}) of a model.bin as ctranslate2.specs'
    ``ModelSpec._serialize`` writes it."""
    data, pos = open(path, 'rb').read(), 0

    def take(fmt):
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def string():
        nonlocal pos
        size = take('H')
        pos += size
        return data[pos - size : pos - 1].decode()

    take('I'), string(), take('I')  # binary version, spec name, spec revision
    variables = {}
    for _ in range(take('I')):
        name = string()
        shape = [take('I') for _ in range(take('B'))]
        dtype, size = _DTYPES[take('B')], take('I')
        variables[name] = np.frombuffer(data[pos : pos + size], dtype).reshape(shape)
        pos += size
    aliases = {string(): string() for _ in range(take('I'))}
    return variables, aliases


def padded(rows: list[list[int]], pad: int) -> np.ndarray:
    out = np.full((len(rows), max(map(len, rows))), pad, np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def assert_scores_equal(directory, model, params, sources, targets, pieces, pad: int) -> None:
    """CTranslate2's log-probability of each token of each target (</s> last, the id lists
    ``targets``) is ours to 1e-4 on a padded batch; ``pieces`` turns ids into its tokens."""
    forward = jax.jit(teacher_forced_logits, static_argnums=0)  # eagerly, each op compiles
    with jax.default_matmul_precision('float32'):
        logits = forward(model, params, padded(sources, pad), padded(targets, pad))
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    batch = [pieces(row) for row in sources]
    scored = ctranslate2_child.score(directory, batch, [pieces(t[:-1]) for t in targets])
    for row, (target, theirs) in enumerate(zip(targets, scored, strict=True)):
        want = log_probs[row, np.arange(len(target)), target]
        np.testing.assert_allclose(theirs, want, atol=1e-4, err_msg=f'row {row}')


def assert_searches_equal(
    directory,
    model,
    params,
    sources: list[list[int]],
    pieces: Callable,
    options: decoding.DecodeOptions,
    constraints: decoding.Constraints,
    beam: bool = True,
    **translate,
) -> list[list[str]]:
    """CTranslate2's greedy outputs (``translate``: its options, ours' equivalents in
    ``options`` and ``constraints``) are ours, token for token; its beam-4 outputs are ours
    with their score (to 1e-4), or a lower one where ours ends a hypothesis with </s> that
    CTranslate2 never offers (the module's docstring), in half the rows at most; ``beam``
    False: greedy alone. Returns our greedy outputs (tokens)."""
    inputs = padded(sources, model.config.special.pad)
    batch = [pieces(row) for row in sources]
    with jax.default_matmul_precision('float32'):
        greedy = decoding.greedy_search(
            model, params, inputs, options=options, constraints=constraints
        )
    ours = [pieces(row) for row in np.asarray(greedy)]
    assert ctranslate2_child.translate(directory, batch, beam_size=1, **translate) == ours
    if not beam:
        return ours
    with jax.default_matmul_precision('float32'):
        sequences, scores = decoding.beam_search(
            model, params, inputs, beam_size=BEAM, options=options, constraints=constraints
        )
    best = [pieces(row) for row in np.asarray(sequences)[:, 0]]
    theirs = ctranslate2_child.translate_scored(
        directory, batch, beam_size=BEAM, patience=100.0, **translate
    )
    same = 0
    for row, (mine, score, (tokens, their_score)) in enumerate(
        zip(best, np.asarray(scores)[:, 0], theirs, strict=True)
    ):
        if tokens == mine:
            same += 1
            np.testing.assert_allclose(their_score, score, atol=1e-4, err_msg=f'row {row}')
        else:
            assert mine[-1] == '</s>' and score > their_score, (row, mine, tokens)
    assert same >= len(sources) // 2
    return ours
