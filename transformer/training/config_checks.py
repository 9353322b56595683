"""Config values checked before a run writes anything: one line for the first bad value.

ml_collections already rejects a command-line value that does not parse as the field's type
(``--config.model.d_model=abc``); these checks catch what parses but cannot work (a dropout
rate of 1, zero warmup steps, a beam of 0, a batch the devices cannot split) and values of
the wrong type set in a config file. `unknown_key_message` turns an override of a key that
does not exist into "unknown config key model.d_modle; did you mean model.d_model?".
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from transformer.data.packing import LONG_EXAMPLES
from transformer.data.tokenizer import MODEL_TYPES, NORMALIZATIONS
from transformer.model.attention import ATTENTION_IMPLS
from transformer.model.config import DTYPES
from transformer.training.best import METRICS
from transformer.training.optim import SCHEDULES
from transformer.training.parallel import MODES
from transformer.training.steps import DROPOUT_PRNGS


class ConfigError(ValueError):
    """A config value that cannot work; the one-line message names the key."""


# The end of the one line that a train step out of memory stops with (train.py adds
# `TRAINING_OUT_OF_MEMORY`'s sentences; benchmarks/train_speed.py uses this alone).
OUT_OF_MEMORY = (
    'Lower train.batch_size, or raise train.grad_accum_steps (the same rows in smaller '
    'micro-batches).'
)
TRAINING_OUT_OF_MEMORY = (
    f'{OUT_OF_MEMORY} Validation decodes eval.batch_size sentences at a time. Checkpoints '
    'already saved are untouched.'
)

_positive = (lambda v: v >= 1, 'an integer >= 1')
_non_negative = (lambda v: v >= 0, '>= 0')
_rate = (lambda v: 0 <= v < 1, 'in [0, 1)')

# key: (type, predicate, what the predicate wants).
_RULES: dict[str, tuple[type, Callable[[Any], bool], str]] = {
    'model.d_model': (int, *_positive),
    'model.num_heads': (int, *_positive),
    'model.d_ff': (int, *_positive),
    'model.num_encoder_layers': (int, *_positive),
    'model.num_decoder_layers': (int, *_positive),
    'model.dropout_rate': (float, *_rate),
    'model.attention_dropout_rate': (float, *_rate),
    'model.relu_dropout_rate': (float, *_rate),
    'model.max_len': (int, *_positive),
    'model.layer_norm_epsilon': (float, lambda v: v > 0, '> 0'),
    'model.dtype': (str, lambda v: v in DTYPES, 'one of ' + ', '.join(map(repr, DTYPES))),
    'data.max_len': (int, lambda v: v >= 2, 'an integer >= 2'),
    'data.vocab_size': (int, lambda v: v >= 4, 'an integer >= 4'),
    'data.vocab_normalization': (
        str,
        lambda v: v in NORMALIZATIONS,
        'one of ' + ', '.join(repr(n) for n in NORMALIZATIONS),
    ),
    'data.long_examples': (str, lambda v: v in LONG_EXAMPLES, "'drop' or 'truncate'"),
    'opt.warmup_steps': (int, *_positive),
    'opt.lr_scale': (float, lambda v: v > 0, '> 0'),
    'opt.cooldown_steps': (int, *_non_negative),
    'opt.b1': (float, *_rate),
    'opt.b2': (float, *_rate),
    'opt.eps': (float, *_non_negative),
    'opt.clip_grad_norm': (float, *_non_negative),
    'train.num_steps': (int, *_positive),
    'train.batch_size': (int, *_positive),
    'train.grad_accum_steps': (int, *_positive),
    'train.label_smoothing': (float, *_rate),
    'train.parallelism': (str, lambda v: v in MODES, "'pmap' or 'sharding'"),
    'train.model_parallelism': (int, *_positive),
    'train.log_every': (int, *_positive),
    'train.eval_every': (int, *_non_negative),
    'train.checkpoint_every': (int, *_positive),
    'train.keep_checkpoints': (int, *_positive),
    'eval.beam_size': (int, *_positive),
    'eval.alpha': (float, *_non_negative),
    'eval.extra_length': (int, *_non_negative),
    'eval.average_last': (int, *_positive),
    'eval.batch_size': (int, *_positive),
    'eval.bleu_every': (int, *_non_negative),
}


def _one_of(*values: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in values, 'one of ' + ', '.join(repr(v) for v in values))


# Checked where present (configs written before a key existed lack it): values that used to
# fail only after the vocabulary was written, or deep in a run, or never.
_OPTIONAL_RULES: dict[str, tuple[type, Callable[[Any], bool], str]] = {
    'model.attention_impl': (str, *_one_of(*ATTENTION_IMPLS)),
    'data.vocab_model_type': (str, *_one_of(*MODEL_TYPES)),
    'opt.schedule': (str, *_one_of(*SCHEDULES)),
    'train.seed': (int, *_non_negative),
    'train.dropout_prng': (str, *_one_of(*DROPOUT_PRNGS)),
    'train.prefetch': (int, *_non_negative),
    'train.early_stop_patience': (int, *_non_negative),
    'eval.best_metric': (str, *_one_of(*METRICS)),
}


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
    value = config
    for part in key.split('.'):
        value = value[part]
    return value


def _type_ok(value: Any, want: type) -> bool:
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, (int, float) if want is float else want)


def check(config: ml_collections.ConfigDict, devices: Sequence[Any] | None = None) -> None:
    """Raises `ConfigError` for the first value that cannot work.

    Args:
      config: the experiment config.
      devices: the devices training will use (default: all devices of all processes); the
        batch must split over them. Skipped for a multi-host run before jax.distributed joins.
    """
    for key, (want, ok, wanted) in (_RULES | _OPTIONAL_RULES).items():
        try:
            value = _get(config, key)
        except KeyError:
            if key in _OPTIONAL_RULES:
                continue
            raise ConfigError(f'config key {key} is missing.') from None
        if not _type_ok(value, want):
            raise ConfigError(f'{key}={value!r} must be of type {want.__name__}.')
        if not ok(value):
            raise ConfigError(f'{key}={value!r} must be {wanted}.')
    model, tc = config.model, config.train
    head_dim = model.get('head_dim')
    if head_dim is not None and (not _type_ok(head_dim, int) or head_dim < 1):
        raise ConfigError(f'model.head_dim={head_dim!r} must be an integer >= 1 (or None).')
    data = config.data
    if data.dataset == 'synthetic' and data.synthetic.num_train < 1:
        raise ConfigError(f'data.synthetic.num_train={data.synthetic.num_train} must be >= 1.')
    if model.get('head_dim') is None and model.d_model % model.num_heads:
        raise ConfigError(
            f'model.d_model={model.d_model} must be a multiple of model.num_heads='
            f'{model.num_heads} (or set model.head_dim).'
        )
    cooldown = config.opt.get('cooldown_steps', 0)
    if cooldown > tc.num_steps:
        raise ConfigError(f'opt.cooldown_steps={cooldown} exceeds train.num_steps={tc.num_steps}.')
    if config.data.max_len > model.max_len:
        raise ConfigError(f'data.max_len={config.data.max_len} exceeds model.max_len.')
    if tc.distributed and devices is None:
        return  # jax cannot be asked for devices before jax.distributed joins the processes
    import jax

    from transformer.training import parallel

    devices = jax.devices() if devices is None else devices
    model_parallelism = tc.model_parallelism if tc.parallelism == 'sharding' else 1
    if len(devices) % model_parallelism:
        raise ConfigError(
            f'train.model_parallelism={model_parallelism} does not divide the {len(devices)} '
            'devices.'
        )
    try:  # which rows each process feeds follows the mesh; some layouts fit no split
        parallel.data_groups(parallel.process_grid(parallel.make_mesh(model_parallelism, devices)))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rows = len(devices) // model_parallelism * tc.grad_accum_steps
    if tc.batch_size % rows:
        raise ConfigError(
            f'train.batch_size={tc.batch_size} must be a multiple of data-parallel devices x '
            f'train.grad_accum_steps = {rows}.'
        )


def _keys(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
    keys = []
    for name, value in config.items():
        keys.append(prefix + name)
        if isinstance(value, ml_collections.ConfigDict):
            keys += _keys(value, f'{prefix}{name}.')
    return keys


def unknown_key_message(config: ml_collections.ConfigDict, argv: Sequence[str]) -> str | None:
    """ "unknown config key K; did you mean M?" for the first ``--config.K`` override in
    ``argv`` that ``config`` does not have (None: every override names a key)."""
    known = _keys(config)
    for arg in argv:
        if not arg.startswith('--config.'):
            continue
        key = arg[len('--config.') :].split('=', 1)[0]
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f'; did you mean {close[0]}?' if close else ''
        return f'unknown config key {key}{hint}'
    return None


def explain_flag_error(error: Exception, argv: list[str]) -> str | None:
    """Names an unknown ``--config.KEY`` override and the nearest valid key."""
    from absl import flags

    if isinstance(error, flags.UnrecognizedFlagError):
        name = error.flagname
        if name.split('.')[0] in ('model', 'data', 'opt', 'train', 'eval'):
            return f"Unknown command line flag '{name}'; did you mean --config.{name}?"
    if isinstance(error, flags.Error):
        return None  # absl's own message names the flag and the bad value
    config_arg = next(
        (a for a in argv if a.startswith('--config=') and '.' not in a.split('=')[0]), None
    )
    if config_arg is None and '--config' in argv[:-1]:
        config_arg = '--config=' + argv[argv.index('--config') + 1]
    if config_arg is None:
        return None
    try:
        config = flags.FLAGS['config'].parser.parse(config_arg.split('=', 1)[1])
    except Exception:  # noqa: BLE001 (the config file's own error: absl's line says it)
        return None
    return unknown_key_message(config, argv)
