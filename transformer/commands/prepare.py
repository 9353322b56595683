"""The prepare command: a run's vocabulary and training token stores, without training.

``python -m transformer.prepare --config CONFIG --workdir W`` (also ``transformer-prepare``)

Builds what the first start of ``train --config CONFIG --workdir W`` would build before its
first step: the joint vocabulary (``W/vocab/``, unless ``data.vocab_path`` gives one) and the
training split's token store, one per corpus of ``data.mix`` (``W/data_cache/``, or
``data.cache_dir``; transformer/data/token_store.py), streaming the text a chunk at a time with
a progress line every few seconds, and ``W/config.json`` (what the vocabulary was made with: a
later ``train`` or ``prepare`` asking for another stops in one line). A cluster job can so
prepare on one machine and then start every process of the run, which find both and read them.
Nothing is built twice: a second prepare, or the training run after it, reuses what is there.
It holds the workdir's lock while it works, so a training run cannot start there meanwhile.
Give ``train`` the same config.

``--verify`` then reads every store of the config whole and checks each file's checksum (an
open of a store checks its files' sizes and times only: docs/data.md, "The token store"), one
line per store; a damaged store stops in one line naming its file.
"""

from __future__ import annotations

import os
import time

from absl import logging

from transformer import data, rundir
from transformer import lock as lock_lib
from transformer.commands import console
from transformer.commands.config_flag import explain_flag_error
from transformer.commands.train import define_run_flags, run_config
from transformer.training import TrainingError, prepare_data


def _size_mib(directory: str) -> float:
    return sum(entry.stat().st_size for entry in os.scandir(directory)) / 2**20


def _verify(stores: list[str]) -> None:
    """The full check of each store, one line each on stdout (the answer asked for); a
    damaged one raises `DataError`."""
    for store in stores:
        start = time.perf_counter()
        pairs = data.verify_token_store(store)
        seconds = time.perf_counter() - start
        print(
            f'Verified {store}: {pairs} pairs, {_size_mib(store):.1f} MiB, every checksum '
            f'matches ({seconds:.1f} s).',
            flush=True,
        )


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.prepare --config CONFIG --workdir W [--verify]``."""
    import sys

    from absl import app, flags

    define_run_flags()
    console.define_flag(
        'verify',
        flags.DEFINE_bool,
        False,
        'Then read every token store of the config whole and check its checksums.',
    )
    flags.FLAGS['verify'].unparse()  # (absl keeps a parsed value for the whole process)

    def main(_):
        config, overridden = run_config()
        start = time.perf_counter()
        workdir = flags.FLAGS.workdir
        try:
            tokenizer, stores = prepare_data(config, workdir, overridden)
            if flags.FLAGS.verify:
                _verify(stores)
        except (data.DataError, rundir.WorkdirError, lock_lib.WorkdirBusy, TrainingError) as e:
            raise SystemExit(f'error: {e}') from None
        pairs = sum(data.token_store_pairs(store) for store in stores)
        logging.info(
            'Prepared %s in %.1f s: a vocabulary of %d ids (%s); %d training pairs in %s '
            '(%.1f MiB).',
            workdir,
            time.perf_counter() - start,
            tokenizer.vocab_size,
            getattr(tokenizer, 'model_path', rundir.path(workdir, rundir.VOCAB_DIR)),
            pairs,
            ', '.join(stores),
            sum(_size_mib(store) for store in stores),
        )

    try:
        argv = console.resolve_config_arg(sys.argv if argv is None else argv)
    except app.UsageError as e:
        console.usage_exit(str(e))
    console.run(main, argv, explain_flag_error)


if __name__ == '__main__':
    cli()
