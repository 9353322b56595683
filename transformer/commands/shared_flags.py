"""The flags the commands share: defining one in a process that may run several commands,
the decoding commands' flags, and ``--config NAME`` made the path of a packaged config."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags

from transformer import schema


def define_flag(name: str, define: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Defines the absl flag ``name`` (default ``args[0]``) unless this process has it, else
    gives it this command's default: the commands share flag names (``--workdir``, ``--out``
    of export and visualize) and several may run in one process (tests, the Python API)."""
    if name not in flags.FLAGS:
        define(name, *args, **kwargs)
    elif flags.FLAGS[name].default != args[0]:
        flags.FLAGS.set_default(name, args[0])
    _COMMAND_FLAGS.append(name)


# The flags the command about to run defined (`define_flag`), for its --help; `run` clears it.
_COMMAND_FLAGS: list[str] = []


def resolve_config_arg(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--config NAME`` (``--config=NAME``, ``NAME:args``) made the path of the
    packaged config NAME (transformer/configs/NAME.py) when NAME is not an existing file.

    ml_collections' config flag only takes paths, and loads the file while absl parses the
    flags, so names are resolved before that. Paths are left as they are.
    """
    from transformer import configs

    def resolve(value: str) -> str:
        name, colon, rest = value.partition(':')
        if os.path.exists(name):
            return value
        if line := configs.moved(name):
            raise app.UsageError(line)
        if name.endswith('.py') or os.sep in name:
            folder = os.path.dirname(name) or '.'
            listed = os.listdir(folder) if os.path.isdir(folder) else []
            near = sorted(f for f in listed if f.endswith('.py'))
            close = difflib.get_close_matches(os.path.basename(name), near, n=1)
            hint = (
                f'; did you mean {os.path.join(os.path.dirname(name), close[0])}?' if close else '.'
            )
            raise app.UsageError(f'--config {name}: no such file{hint}')
        if name not in configs.names():
            close = difflib.get_close_matches(name, configs.names(), n=1)
            hint = f' Did you mean {close[0]}?' if close else ''
            raise app.UsageError(
                f'--config {name}: no such file, and the packaged configs are '
                f'{", ".join(configs.names())}.{hint}'
            )
        return configs.path(name) + colon + rest

    args = list(argv)
    for i, arg in enumerate(args):
        if arg in ('--config', '-config') and i + 1 < len(args):
            args[i + 1] = resolve(args[i + 1])
        elif arg.startswith(('--config=', '-config=')):
            flag, _, value = arg.partition('=')
            args[i] = f'{flag}={resolve(value)}'
    return args


def define_checkpoint_flags() -> None:
    """Flags shared by the commands that load a trained run: which run, which checkpoints."""
    define_flag('workdir', flags.DEFINE_string, None, 'Directory of the training run.')
    define_flag(
        'step',
        flags.DEFINE_integer,
        None,
        'Checkpoint step to load (default: the latest); with --average_last, the last one '
        'of those averaged.',
    )
    define_flag(
        'average_last',
        flags.DEFINE_integer,
        None,
        'Average the last K checkpoints, up to --step if given (default without --step: '
        'eval.average_last).',
        lower_bound=1,
    )
    define_flag(
        'best',
        flags.DEFINE_bool,
        False,
        'Load the best checkpoint by validation BLEU (WORKDIR/best) instead.',
    )
    define_flag(
        'scan_layers',
        flags.DEFINE_bool,
        None,
        "The layers as one scan (True) or one by one (False); default: the run's "
        'model.scan_layers. Checkpoints of either layout load.',
    )


def define_decoding_flags() -> None:
    """Flags shared by the evaluate and translate commands: which checkpoint, which search."""
    define_checkpoint_flags()
    define_language_flags()
    _define_search_flags()
    _define_layout_flags()
    _define_sampling_flags()
    define_flag(
        'batch_size',
        flags.DEFINE_integer,
        None,
        'Sentences per batch (default: config).',
        lower_bound=1,
    )
    define_flag(
        'ensemble',
        flags.DEFINE_list,
        [],
        'Other workdirs decoded together with --workdir as one ensemble (comma-separated; '
        'the same model and vocabulary; each loaded by --step / --average_last / --best).',
    )


def _define_search_flags() -> None:
    """The search's own flags: beam size, length penalty alpha and rule, constraints."""
    define_flag(
        'beam_size',
        flags.DEFINE_integer,
        None,
        'Beam size; 1 = greedy (default: config).',
        lower_bound=1,
    )
    define_penalty_flags()
    define_flag(
        'min_length',
        flags.DEFINE_integer,
        0,
        'Forbid EOS before this many output tokens (the output limit still ends an output).',
    )
    define_flag(
        'no_repeat_ngram',
        flags.DEFINE_integer,
        0,
        'Forbid any n-gram of this size from appearing twice in an output (0 = off).',
    )


def define_language_flags() -> None:
    """What a source starts with and an output is forced to start with (translate, evaluate,
    score): a multilingual run's language pair, or the token a run of another kind reads first
    (transformer/data/languages.py resolves them)."""
    define_flag(
        'source_tag',
        flags.DEFINE_string,
        None,
        'A token of the vocabulary put first in every source, as its id: a multilingual '
        "MarianMT's target language, e.g. '>>fra<<' (required by such models).",
    )
    for name, side, example in (
        ('source_lang', 'source', 'eng_Latn'),
        ('target_lang', 'target', 'deu_Latn'),
    ):
        define_flag(
            name,
            flags.DEFINE_string,
            None,
            f"The {side} language's code of a run with language codes (NLLB-200, M2M100, "
            f"mBART-50), e.g. {example} (default: the run's data.{name}_code).",
        )


def define_penalty_flags() -> None:
    """The length penalty's alpha and rule (the searches' and the score command's)."""
    define_flag(
        'alpha',
        flags.DEFINE_float,
        None,
        'Length penalty alpha (default: eval.alpha).',
        lower_bound=0.0,
    )
    if 'not finite' not in [v.message for v in flags.FLAGS['alpha'].validators]:  # inf, nan
        flags.register_validator('alpha', lambda v: v is None or math.isfinite(v), 'not finite')
    define_flag(
        'length_penalty',
        flags.DEFINE_enum,
        None,
        schema.LENGTH_PENALTIES,
        "Length penalty rule: 'gnmt' or 'fairseq' (default: eval.length_penalty).",
    )


def _define_layout_flags() -> None:
    """Where evaluate and translate decode: the run's parallel settings (flags named as its
    config keys override them) and the processes of a multi-process decode."""
    define_flag(
        'parallelism',
        flags.DEFINE_enum,
        None,
        schema.PARALLELISMS,
        "The mesh to decode on: 'sharding' (the run's ('data', 'model') mesh) or 'pmap' (data "
        'only, parameters replicated) (default: train.parallelism).',
    )
    define_flag(
        'model_parallelism',
        flags.DEFINE_integer,
        None,
        "Devices of the mesh's model axis (default: train.model_parallelism).",
        lower_bound=1,
    )
    define_flag(
        'fsdp',
        flags.DEFINE_bool,
        None,
        "Shard every parameter's d_model axis over the data axis (default: train.fsdp).",
    )
    define_flag(
        'gather_params',
        flags.DEFINE_bool,
        False,
        'Gather sharded (FSDP) parameters onto every device once, before decoding: no '
        'per-step all-gathers, a full copy per device (docs/parallelism.md).',
    )
    define_flag(
        'coordinator_address',
        flags.DEFINE_string,
        None,
        'HOST:PORT of process 0 of a multi-process decode (with --num_processes, '
        '--process_id); process 0 reads the input and writes every output.',
    )
    define_flag(
        'num_processes', flags.DEFINE_integer, None, 'Processes of the decode.', lower_bound=1
    )
    define_flag('process_id', flags.DEFINE_integer, None, 'This process: 0 .. N-1.', lower_bound=0)
    define_flag(
        'init_timeout_s',
        flags.DEFINE_integer,
        60,
        'A process that cannot reach the coordinator stops after this many seconds.',
        lower_bound=1,
    )


def _define_sampling_flags() -> None:
    """Sampling instead of a search; each setting unset (None) unless given, so that one given
    without --sampling is refused rather than ignored."""
    define_flag(
        'sampling',
        flags.DEFINE_bool,
        False,
        "Draw each output token from the model's distribution instead of searching.",
    )
    for name, define, doc in (
        ('temperature', flags.DEFINE_float, 'Sampling: divide the logits by T (default 1).'),
        (
            'top_k',
            flags.DEFINE_integer,
            'Sampling: only the K most probable tokens (default: all).',
        ),
        (
            'top_p',
            flags.DEFINE_float,
            'Sampling: only the most probable tokens holding probability P (default 1: all).',
        ),
        (
            'seed',
            flags.DEFINE_integer,
            "Sampling: the seed (default 0); line i's key is fold_in(key(seed), i).",
        ),
        (
            'num_samples',
            flags.DEFINE_integer,
            'Sampling: outputs per input line (default 1); more are written as n-best rows.',
        ),
    ):
        define_flag(name, define, None, doc)
