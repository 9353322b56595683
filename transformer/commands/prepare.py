"""The prepare command: a run's vocabulary and training token stores, without training.

``python -m transformer.prepare --config CONFIG --workdir W`` (also ``transformer-prepare``)

Builds what the first start of ``train --config CONFIG --workdir W`` would build before its
first step: the joint vocabulary (``W/vocab/``, unless ``data.vocab_path`` gives one) and the
training split's token store, one per corpus of ``data.mix`` (``W/data_cache/``, or
``data.cache_dir``; transformer/data/token_store.py), streaming the text a chunk at a time with
a progress line every few seconds. A cluster job can so prepare on one machine and then start
every process of the run, which find both and read them. Nothing is built twice: a second
prepare, or the training run after it, reuses what is there. It holds the workdir's lock while
it works, so a training run cannot start there meanwhile. Give ``train`` the same config.
"""

from __future__ import annotations

import os
import time

from absl import logging

from transformer import configs, data, rundir, schema
from transformer import lock as lock_lib
from transformer.commands import console
from transformer.commands.config_flag import explain_flag_error
from transformer.training import TrainingError, check_config, prepare_data


def _size_mib(directory: str) -> float:
    return sum(entry.stat().st_size for entry in os.scandir(directory)) / 2**20


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.prepare --config CONFIG --workdir W``."""
    import sys

    from absl import app, flags
    from ml_collections import config_flags

    console.define_flag(
        'config',
        config_flags.DEFINE_config_file,
        None,
        f'Experiment config, as train takes it: a packaged one ({", ".join(configs.names())}) '
        'or a file path.',
        lock_config=True,
    )
    console.define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')

    def main(_):
        if not flags.FLAGS['config'].present:
            console.require('config')
        console.require('workdir')
        try:
            file = config_flags.get_config_filename(flags.FLAGS['config'])
            config = check_config(schema.complete(configs.checked(flags.FLAGS.config, file)))
        except (schema.ConfigError, ValueError) as e:
            console.usage_exit(str(e))
        overridden = list(config_flags.get_override_values(flags.FLAGS['config']))
        start = time.perf_counter()
        workdir = flags.FLAGS.workdir
        try:
            tokenizer, stores = prepare_data(config, workdir, overridden)
        except (data.DataError, rundir.WorkdirError, lock_lib.WorkdirBusy, TrainingError) as e:
            raise SystemExit(f'error: {e}') from None
        pairs = sum(data.open_store(store).num_examples for store in stores)
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
