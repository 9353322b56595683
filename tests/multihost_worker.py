"""`python train.py` for the multi-host tests, with two hooks a test sets by environment:

- ``TEST_BLEU='[[...], [...]]'``: process i reports row i's k-th value as its validation
  BLEU at its k-th evaluation (instead of decoding), so the processes disagree, as BLEU
  computed on two GPUs can in its last bit.
- Every SentencePiece training prints ``TRAINED VOCABULARY``, every token store built
  ``BUILT TOKEN STORE``.

At the end each process prints ``RESULT {"step": ..., "stopped_early": ..., "best": ...}``:
what it decided, for the test to compare across processes.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformer.commands import train as trainer  # noqa: E402
from transformer.data import token_store, tokenizer  # noqa: E402
from transformer.schema import METRICS  # noqa: E402
from transformer.training import validation


def _fake_bleu(table):
    calls = []

    def bleu(self, params):
        import jax

        row = table[jax.process_index()]
        value = float(row[min(len(calls), len(row) - 1)])
        calls.append(value)
        return dict.fromkeys(METRICS, value)

    return bleu


def _counted(build, line):
    def counted(*args, **kwargs):
        print(line, flush=True)
        return build(*args, **kwargs)

    return counted


def _reported(train_and_evaluate):
    def run(*args, **kwargs):
        final = train_and_evaluate(*args, **kwargs)
        keys = ('step', 'stopped_early', 'best')
        print('RESULT', json.dumps({k: final.get(k) for k in keys}), flush=True)
        return final

    return run


if __name__ == '__main__':
    if 'TEST_BLEU' in os.environ:
        validation.Validation.bleu = _fake_bleu(json.loads(os.environ['TEST_BLEU']))
    tokenizer.train_tokenizer = _counted(tokenizer.train_tokenizer, 'TRAINED VOCABULARY')
    token_store.build = _counted(token_store.build, 'BUILT TOKEN STORE')
    trainer.train_and_evaluate = _reported(trainer.train_and_evaluate)
    trainer.cli()
