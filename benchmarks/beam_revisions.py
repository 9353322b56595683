"""Beam search of this checkout beside the beam search of an earlier git revision, one process.

    python benchmarks/beam_revisions.py --rev 6ef35c5
    python benchmarks/beam_revisions.py --rev 6ef35c5 --max_decode_len 80

The revision's beam search (``transformer/decoding/beam.py``, or ``transformer/beam.py`` in
revisions before the package's layers, read with ``git show``) is loaded as a module of its own
and runs on this checkout's model, attention and step, so this compares beam searches, not
whole packages; a revision whose beam.py imports modules or names the present checkout no
longer has fails at import. Both search the same random Multi30k-sized model
(`benchmarks/decode_speed.py`'s sizes and sources) for exactly ``--max_decode_len`` steps (no
early stop), must return the same sequences and scores, and are timed interleaved
(present, revision, present, ...): the median of the per-round ratios is printed and saved.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

from benchmarks.decode_speed import (  # noqa: E402
    add_size_flags,
    model_config,
    random_sources,
    save_report,
)
from transformer import decoding  # noqa: E402
from transformer.model import Transformer  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_revision(rev: str):
    """The beam search module as of git revision ``rev``, imported as its own module."""
    for path in ('transformer/decoding/beam.py', 'transformer/beam.py'):
        source = subprocess.run(
            ['git', 'show', f'{rev}:{path}'], cwd=REPO, capture_output=True, text=True
        )
        if not source.returncode:
            break
    else:
        raise SystemExit(f'error: git show {rev}:{path}: {source.stderr.strip()}')
    module = types.ModuleType('beam_at_revision')
    exec(compile(source.stdout, f'{rev}:{path}', 'exec'), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rev', required=True, help='git revision to compare with')
    add_size_flags(parser, repeats=7)
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/beam_revisions.json'))
    args = parser.parse_args()
    inputs = random_sources(args)
    model = Transformer(model_config(args))
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), inputs[:1], inputs[:1])['params'])
    searches = {
        'present': decoding,
        args.rev: load_revision(args.rev),
    }

    def run(module):
        return module.beam_search(
            model,
            params,
            inputs,
            beam_size=args.beam_size,
            max_decode_len=args.max_decode_len,
            alpha=args.alpha,
            early_stop=False,
        )

    outputs = {name: jax.block_until_ready(run(m)) for name, m in searches.items()}
    (seqs, scores), (old_seqs, old_scores) = outputs.values()
    np.testing.assert_array_equal(np.asarray(seqs), np.asarray(old_seqs))
    np.testing.assert_allclose(np.asarray(scores), np.asarray(old_scores), rtol=1e-5, atol=1e-5)
    times = {name: [] for name in searches}
    for _ in range(args.repeats):
        for name, module in searches.items():
            start = time.perf_counter()
            jax.block_until_ready(run(module))
            times[name].append(time.perf_counter() - start)
    ratio = statistics.median(p / r for p, r in zip(times['present'], times[args.rev], strict=True))
    for name, values in times.items():
        print(f'{name:>10}: best {min(values):.3f} s, median {statistics.median(values):.3f} s')
    print(
        f'present / {args.rev}: x{ratio:.3f} (median of {args.repeats} interleaved rounds); '
        'same sequences and scores'
    )
    save_report(args, {'seconds': times, 'present_over_revision_median': ratio})


if __name__ == '__main__':
    main()
