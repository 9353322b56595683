"""The train command: ``python train.py --config configs/X.py --workdir DIR`` (also
``transformer-train --config X``): flags, the config's checks, one-line errors and exit
codes. The loop itself is transformer/training/loop.py (`train_and_evaluate`, importable
from here for Python use).
"""

from __future__ import annotations

from absl import logging

from transformer import configs, multihost, rundir, schema
from transformer import lock as lock_lib
from transformer.commands import console
from transformer.commands.config_flag import explain_flag_error
from transformer.training import (
    TRAINING_OUT_OF_MEMORY,
    Interrupted,
    TrainingError,
    check_config,
    train_and_evaluate,
)


def summary(final: dict, workdir: str) -> str:
    """One line of a finished run's figures; all of them are in final_metrics.json."""
    parts = [f'step {final.get("step")}']
    if 'train' in final:
        parts.append(f'train loss {final["train"]["loss"]:.4f}')
    if 'validation' in final:
        parts.append(f'validation loss {final["validation"]["loss"]:.4f}')
    best = final.get('best') or {}
    if best.get('score') is not None:
        parts.append(f'best validation BLEU {best["score"]:.2f} at step {best["step"]}')
    if final.get('stopped_early'):
        parts.append('stopped early')
    parts.append(f'{final.get("wall_time_s", 0):.0f} s')
    where = rundir.path(workdir, rundir.FINAL_METRICS_FILE)
    return ', '.join(parts) + f'; every figure in {where}.'


def define_run_flags() -> None:
    """``--config`` and ``--workdir``, the flags of a command that works on a training run
    (train, prepare)."""
    from absl import flags
    from ml_collections import config_flags

    console.define_flag(
        'config',
        config_flags.DEFINE_config_file,
        None,
        f'Experiment config: a packaged one by name ({", ".join(configs.names())}) or a file '
        'path, e.g. configs/base.py.',
        lock_config=True,
    )
    console.define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')


def run_config() -> tuple[schema.Config, list[str]]:
    """The ``--config`` (`define_run_flags`) typed and checked once (transformer/schema/),
    and the keys the command line overrides; a missing flag or a bad value is a usage error
    in one line."""
    from absl import flags
    from ml_collections import config_flags

    if not flags.FLAGS['config'].present:  # (a file whose get_config() returned None is)
        console.require('config')
    console.require('workdir')
    try:
        file = config_flags.get_config_filename(flags.FLAGS['config'])
        config = check_config(schema.complete(configs.checked(flags.FLAGS.config, file)))
    except (schema.ConfigError, ValueError) as e:
        console.usage_exit(str(e))
    return config, list(config_flags.get_override_values(flags.FLAGS['config']))


def cli(argv: list[str] | None = None) -> None:
    """``python train.py --config configs/X.py --workdir DIR`` (also ``transformer-train``;
    ``--config X`` names a packaged config, transformer/configs/X.py)."""
    import sys

    from absl import app, flags

    define_run_flags()

    def main(_):
        config, overridden = run_config()
        try:
            final = train_and_evaluate(config, flags.FLAGS.workdir, overridden=overridden)
        except (Interrupted, KeyboardInterrupt) as e:
            print(str(e) or 'Interrupted before the first step.', file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        except schema.ConfigError as e:  # found once the devices are known
            console.usage_exit(str(e))
        except (
            TrainingError,
            rundir.WorkdirError,
            lock_lib.WorkdirBusy,
            multihost.OtherProcessFailed,
            multihost.NotShared,
            ValueError,
        ) as e:
            raise SystemExit(f'error: {e}') from None
        logging.info('Done: %s', summary(final, flags.FLAGS.workdir))

    try:
        argv = console.resolve_config_arg(sys.argv if argv is None else argv)
    except app.UsageError as e:
        console.usage_exit(str(e))
    console.run(main, argv, explain_flag_error, TRAINING_OUT_OF_MEMORY)
