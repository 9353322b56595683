"""What evaluate, translate and the Python API do before they decode: join the processes of a
multi-process decode, build the run's decoding layout from its parallel settings (flags named
as the config keys override them) and restore its checkpoints (averaged, or an ensemble's)
straight into that layout (transformer/decoding/mesh.py says how a decode then runs on it)."""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Sequence
from typing import Any

import jax

from transformer import data as data_lib
from transformer import decoding, multihost, rundir, schema, training
from transformer.checkpoint import load_model
from transformer.model import Transformer

PyTree = Any
LAYOUT_KEYS = ('parallelism', 'model_parallelism', 'fsdp')  # flags named as train.KEY


@dataclasses.dataclass
class LoadedRun:
    """A run (or an ensemble of runs) ready to decode on its layout."""

    config: schema.Experiment
    tokenizer: data_lib.Tokenizer
    model: Transformer
    params: PyTree  # in ``layout.shardings()``; an `Ensemble` for several runs
    member_steps: list[list[int]]  # the checkpoints loaded of each run
    layout: decoding.DecodeLayout
    forced: tuple[int, ...] = ()  # the ids every output starts with: the target code
    pair: tuple[str, str] | None = None  # a multilingual run's (source code, target code)

    def options(self, alpha: float | None, length_penalty: str | None) -> decoding.DecodeOptions:
        """The run's `decoding.DecodeOptions` with a command's alpha and rule (None: the
        run's), its target code forced first."""
        penalty = dict(alpha=alpha, length_penalty=length_penalty)
        return decoding.decode_options(self.config.eval, **penalty, forced=self.forced)


def join_processes(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    init_timeout_s: int = 60,
) -> None:
    """``jax.distributed.initialize`` for a decode of several processes (all three flags
    given), before jax is used; nothing for one process. One ``error:`` line for a process id
    outside the count or a coordinator that does not answer within ``init_timeout_s``."""
    given = (coordinator_address, num_processes, process_id)
    if all(v is None for v in given):
        return
    if any(v is None for v in given):
        raise SystemExit(
            'error: a multi-process decode needs --coordinator_address, --num_processes and '
            '--process_id together.'
        )
    settings = types.SimpleNamespace(
        distributed=True,
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        init_timeout_s=init_timeout_s,
    )
    try:
        training.init_distributed(settings, keys='--')
    except training.TrainingError as e:
        raise SystemExit(f'error: {e}') from None


def load_run(
    workdir: str,
    *,
    step: int | None = None,
    average_last: int | None = None,
    best: bool = False,
    ensemble: Sequence[str] = (),
    gather_params: bool = False,
    devices: Sequence[Any] | None = None,
    source_tag: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    tag_later: bool = False,
    scan_layers: bool | None = None,
    **layout_flags: Any,
) -> LoadedRun:
    """The run of ``workdir`` (with the ``ensemble`` runs) on its decoding layout.

    ``source_tag`` (a token first in every source), ``source_lang`` and ``target_lang`` (a
    multilingual run's pair): checked before a checkpoint is read (`data.languages_of`;
    ``tag_later``: they may come with the Python API's calls).

    ``layout_flags``: ``parallelism`` / ``model_parallelism`` / ``fsdp``, each overriding the
    run's ``train`` key of that name when not None. ``devices``: default every process's.

    Raises:
      ConfigError: a layout that the devices or the model cannot take (training's checks),
        before any checkpoint is read. WorkdirError, DataError as `load_model`.
    """
    config = rundir.read_config(workdir)
    vocabulary = rundir.load_tokenizer(config, workdir)
    chosen = dict(source_tag=source_tag, data_config=config.data, later=tag_later)
    pair = (source_lang, target_lang)
    data_lib.languages_of(vocabulary, *pair, **chosen)  # fails fast, before the checkpoints
    settings = training.ParallelSettings.of(config.train, **layout_flags)
    layouts: list[decoding.DecodeLayout] = []

    def shardings(model: Transformer) -> PyTree:
        if not layouts:
            layouts.append(
                training.decode_layout(
                    model, settings, gather_params=gather_params, devices=devices
                )
            )
        return layouts[0].shardings()

    which = dict(step=step, average_last=average_last, best=best, shardings=shardings)
    if ensemble:
        config, tokenizer, model, params, member_steps = decoding.load_ensemble(
            [workdir, *ensemble], **which, scan_layers=scan_layers
        )
    else:
        config, tokenizer, model, params, steps = load_model(
            workdir, **which, tokenizer=vocabulary, scan_layers=scan_layers
        )
        member_steps = [steps]
    chosen = data_lib.languages_of(tokenizer, *pair, **chosen)
    run = (config, chosen.tokenizer, model, params, member_steps, layouts[0])
    return LoadedRun(*run, chosen.forced, chosen.pair)


def check_split(workdir: str, config: schema.Experiment, split: str) -> None:
    """One line, before anything is read, for a ``split`` the run's data source does not
    have (`data.check_split`), or for a path it reads its splits from (`schema.split_paths`)
    that no longer exists: a `WorkdirError` naming the setting and the file that holds it
    (no command line of a decode overrides the run's config)."""
    data_lib.check_split(config.data, split)
    for key in schema.split_paths(config.data):
        value = getattr(config.data, key.split('.')[1])
        if os.path.exists(schema.absolute(value)):
            continue
        changed = [c for c in rundir.read_history(workdir) if c['key'] == key]
        where = rundir.HISTORY_FILE if changed else rundir.CONFIG_FILE
        raise rundir.WorkdirError(
            f'{rundir.path(workdir, where)} holds {key}={value}, which does not exist (moved?): '
            f'set {key} there to where the files are now, as an absolute path.'
        )


def layout_summary(layout: decoding.DecodeLayout, sentences: list[int]) -> dict[str, Any]:
    """What evaluate's JSON says of where it decoded: ``devices``, ``processes`` and
    ``sentences_per_process`` (one count per process)."""
    return {
        'devices': len(layout.devices),
        'processes': jax.process_count(),
        'mesh': dict(layout.mesh.shape),
        'sentences_per_process': sentences,
    }


def read_on_main(read) -> bytes:
    """``read()`` (the input's bytes) on process 0, the same bytes on every process."""
    return multihost.broadcast_bytes(read() if multihost.is_main() else b'')
