"""A lower bound on the memory a config needs, checked before a run builds anything.

A length or a batch far beyond what the machine holds (``data.max_len=1000000000``) used to
fail after the run directory was written, in numpy's or XLA's allocator ("Unable to allocate
119. GiB"). `check` refuses it first, in one line naming the settings. The figures are
lower bounds, not a model of XLA's temporaries: only what a step cannot do without (the
layers' weights with their gradient and Adam's two moments, the residual stream entering
every layer, kept for the backward pass under every ``model.remat`` policy, the host's batch
arrays, a decoder's key/value cache and, once the vocabulary is known, the [V, D] embeddings
with their gradient and Adam's moments and, where the loss is not chunked, the float32
[tokens, vocabulary] logits with their gradient), so a config refused here can never run, and
one that passes may still run out of memory. At NLLB-200's 256206 pieces the embedding is
262M of the 600M model's 615M parameters.

Training therefore also checks the step itself: `step_refusal` compares XLA's memory
analysis of the compiled step (what it needs beyond its arguments, which are in memory
already: outputs + temporaries - donated) with the memory the process may still take
(`room`: on a CPU, transformer/backends/host_memory.py's `available`, of which a step may
take 90%; on an accelerator, the device's limit minus what it holds), before the first step
runs. On a CPU an allocation past that is often granted (the kernel overcommits) and the
process is killed once it touches the memory, with no message. That analysis is of the step
as compiled, so it follows ``model.remat`` (transformer/model/remat.py): 'none' keeps every
activation of every layer; 'full' only each layer's input (the bound's residual stream) and
what one layer recomputes at a time; 'dots' also the outputs of the projections and the
feed-forward's products; 'attention' also the attention's output.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from transformer.model import layer_param_count, param_count
from transformer.model import settings as model_settings
from transformer.schema import ConfigError, Experiment

GiB = 2**30
# int32 arrays a packed training batch holds per token (inputs, targets, segmentations,
# positions of each side).
_BATCH_ARRAYS = 6
# Copies of each parameter a train step holds: the value, its gradient, Adam's two moments.
_PARAM_COPIES = 4
HOST = 'the batch arrays'  # the part that lives in host memory
LOGITS = 'the logits and their gradient'
EMBEDDINGS = "the embeddings with their gradient and Adam's moments"
# The share of the host's free memory a CPU step may take: the process also holds what
# XLA's analysis does not count (the runtime, the data pipeline, validation's buffers), and
# MemAvailable is an estimate that other processes move: configs/tiny.py's step at
# train.batch_size=5000 (21.8 GiB) started with 22-23 GiB available was killed on a 24 GiB
# host. An accelerator's allocator refuses
# an allocation past its limit in one line instead: there the whole room counts.
_HOST_SHARE = 0.9


def layer_params(experiment: Experiment) -> int:
    """The parameters of the model's layers, as the chosen variants declare them
    (transformer/model/variants.py). The embeddings are left out: the vocabulary may end up
    smaller than data.vocab_size."""
    return layer_param_count(experiment.model)


def outer_params(experiment: Experiment, vocab_size: int) -> int:
    """The parameters outside the layers with a vocabulary of ``vocab_size`` pieces: the
    [V, D] embedding tables (one, or two and the [D, V] output projection, by
    model.share_embeddings), a [V] logits bias, final norms, a learned position table."""
    m = dataclasses.replace(experiment.model, vocab_size=vocab_size)
    return param_count(m) - layer_param_count(m)


def _itemsize(dtype: Any) -> int:
    import jax.numpy as jnp

    return jnp.dtype(dtype).itemsize


def needs(
    experiment: Experiment, num_devices: int, vocab_size: int | None = None
) -> dict[str, tuple[int, str]]:
    """Bytes each part of a training run needs at least, per device (`HOST`: in host
    memory), with the settings that decide it: {part: (bytes, settings)}. ``vocab_size``: the
    vocabulary's real size, once known (it may end up below data.vocab_size); with it the
    embeddings (`EMBEDDINGS`) count, and with ``train.loss_chunk_tokens=0`` the float32 logits
    and their gradient (`LOGITS`) too."""
    m, tc = experiment.model, experiment.train
    length = experiment.data.max_len
    model_parallel = tc.model_parallelism if tc.parallelism == 'sharding' else 1
    data_parallel = max(1, num_devices // model_parallel)
    rows = max(1, tc.batch_size // (data_parallel * tc.grad_accum_steps))
    size = _itemsize(m.dtype)
    # A device's share of the weights: 'model' splits heads, d_ff and the vocabulary (where it
    # divides: transformer/training/parallel.py), FSDP d_model over 'data'; never less.
    shards = max(1, model_parallel * (data_parallel if tc.fsdp else 1))
    copies = _PARAM_COPIES * _itemsize(m.param_dtype)
    params = copies * layer_params(experiment) // shards
    layers = m.num_encoder_layers + m.num_decoder_layers
    ev = experiment.eval
    # A search runs for the source's length + extra_length steps, and a source has a token.
    cache = decode_cache_bytes(experiment, ev.batch_size, ev.beam_size, 1 + ev.extra_length)
    return {
        "the layers' weights with their gradient and Adam's moments": (
            params,
            f'model.d_model={m.d_model}, model.d_ff={m.d_ff} and {layers} layers',
        ),
        # Each layer's input, which every model.remat policy keeps ('full' keeps only it).
        "the layers' inputs": (
            rows * length * m.d_model * size * layers,
            f'train.batch_size={tc.batch_size} rows x data.max_len={length} tokens '
            f'(over {data_parallel} data-parallel devices, train.grad_accum_steps='
            f'{tc.grad_accum_steps}) x model.d_model={m.d_model} x {layers} layers',
        ),
        HOST: (
            tc.batch_size * length * 4 * _BATCH_ARRAYS * max(1, tc.prefetch + 1),
            f'train.batch_size={tc.batch_size} x data.max_len={length}',
        ),
        # Validation's BLEU and the evaluate command decode with the eval settings.
        'the decoder cache': (
            cache,
            f'eval.batch_size={ev.batch_size} sentences x eval.beam_size={ev.beam_size} x '
            f'(1 + eval.extra_length={ev.extra_length}) tokens',
        ),
        **_vocabulary_parts(experiment, vocab_size, rows, shards, (data_parallel, model_parallel)),
    }


def _vocabulary_parts(
    experiment: Experiment,
    vocab_size: int | None,
    rows: int,
    shards: int,
    parallel: tuple[int, int],
) -> dict[str, tuple[int, str]]:
    """`needs`' parts that grow with the vocabulary, once its size is known: the embeddings
    (a device's 1/``shards`` of them) and, unless the loss is chunked, the logits of a
    device's ``rows``. ``parallel``: the data- and model-parallel device counts; the 'model'
    axis splits the vocabulary where it divides it (transformer/training/parallel.py), so the
    logits count 1/model-parallel of it: a lower bound either way."""
    m, tc, length = experiment.model, experiment.train, experiment.data.max_len
    data_parallel, model_parallel = parallel
    if not vocab_size:
        return {}
    pieces = f'{vocab_size} pieces (data.vocab_size={experiment.data.vocab_size})'
    weights = _PARAM_COPIES * _itemsize(m.param_dtype) * outer_params(experiment, vocab_size)
    parts = {
        EMBEDDINGS: (
            weights // shards,
            f'{pieces} x model.d_model={m.d_model}, model.share_embeddings={m.share_embeddings!r}',
        )
    }
    if not tc.loss_chunk_tokens:
        # float32 [rows, T, V] logits and their gradient: the largest term of a big-vocabulary
        # step (8 GB for configs/base.py), which train.loss_chunk_tokens never builds.
        parts[LOGITS] = (
            rows * length * vocab_size * 8 // model_parallel,
            f'train.batch_size={tc.batch_size} rows (over {data_parallel} data-parallel '
            f'devices, train.grad_accum_steps={tc.grad_accum_steps}) x data.max_len={length} '
            f'tokens x {pieces} with train.loss_chunk_tokens=0',
        )
    return parts


def decode_cache_bytes(experiment: Experiment, sentences: int, beam: int, length: int) -> int:
    """The decoder's key/value cache for ``sentences`` x ``beam`` hypotheses of ``length``:
    K = model.num_kv_heads heads of H each, per layer, for the keys and the values."""
    m = experiment.model
    inner = model_settings.num_kv_heads(m) * model_settings.head_dim(m)
    return 2 * m.num_decoder_layers * sentences * beam * length * inner * _itemsize(m.dtype)


def host_bytes() -> int | None:
    """The machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):
        return None


def device_bytes(devices: Sequence[Any]) -> tuple[int | None, str]:
    """Memory of one device and what it is. CPU devices share the host's memory: each is
    compared with all of it, so that simulated devices (tests) never refuse a config that
    one real CPU device could run."""
    device = devices[0]
    if device.platform == 'cpu':
        return host_bytes(), 'host memory'
    try:  # GPUs and TPUs say; a backend without memory statistics raises or returns None
        limit = (device.memory_stats() or {}).get('bytes_limit')
    except Exception:  # noqa: BLE001 - no figure, no check
        limit = None
    return limit, f'{device.device_kind} memory'


def check(experiment: Experiment, devices: Sequence[Any], vocab_size: int | None = None) -> None:
    """`ConfigError` naming the settings when a part alone needs more than the machine has
    (``vocab_size``: the vocabulary's size, once known: see `needs`)."""
    per_device, where = device_bytes(devices)
    host = host_bytes()
    for part, (size, settings) in needs(experiment, len(devices), vocab_size).items():
        limit, what = (host, 'host memory') if part == HOST else (per_device, where)
        if limit is None or size <= limit:
            continue
        share = '' if part == HOST or len(devices) == 1 else ' per device'
        raise ConfigError(
            f'{settings}: {part} alone need at least {size / GiB:,.1f} GiB{share}, more than '
            f'the {limit / GiB:,.1f} GiB of {what}{share}; lower them.'
        )


def check_decoding(
    experiment: Experiment,
    sentences: int,
    beam: int,
    vocab_size: int,
    devices: Sequence[Any] | None = None,
    beam_flag: str = '--beam_size',
    data_shards: int = 1,
) -> None:
    """`ConfigError` naming ``--beam_size`` / ``--batch_size`` for a search that cannot work
    (evaluate, translate): a beam wider than the vocabulary, or a decoder cache of one
    device's share of ``sentences`` x ``beam`` hypotheses that alone exceeds the memory of
    ``devices`` (default: this process's first). A batch's sentences are split over a mesh's
    ``data_shards`` devices (transformer/decoding/mesh.py), each device caching its share.
    ``beam_flag``: the flag that set the beam (translate's ``--nbest`` K searches with a
    beam of at least K)."""
    if devices is None:
        import jax

        devices = jax.local_devices()[:1]
    if beam > vocab_size:
        raise ConfigError(
            f'{beam_flag}={beam} exceeds the vocabulary of {vocab_size} pieces: a beam cannot '
            'hold more hypotheses than the first step has words.'
        )
    length = 1 + experiment.eval.extra_length
    per_device = -(-sentences // data_shards)
    size = decode_cache_bytes(experiment, per_device, beam, length)
    limit, where = device_bytes(devices)
    if limit is not None and size > limit:
        raise ConfigError(
            f'--batch_size={sentences} sentences x {beam_flag}={beam} x (1 + eval.extra_length='
            f'{experiment.eval.extra_length}) tokens: the decoder cache alone needs at least '
            f'{size / GiB:,.1f} GiB per device ({per_device} sentences on each of '
            f'{data_shards}), more than the {limit / GiB:,.1f} GiB of {where}; lower them.'
        )


# --- the compiled step against the memory the process may still take ------------------------


def room(devices: Sequence[Any]) -> tuple[int | None, str]:
    """Bytes the process may still allocate where ``devices`` (this process's) keep a step's
    buffers, and what sets the figure; (None, '') where nothing says. CPU devices share the
    host's memory: `host_memory.available` (MemAvailable, cgroup limits). An accelerator: the
    least, over ``devices``, of its ``bytes_limit`` minus its ``bytes_in_use``."""
    if devices[0].platform == 'cpu':
        from transformer.backends import host_memory

        found = host_memory.available()
        return (None, '') if found is None else (found[0], f'host memory ({found[1]})')
    least = None
    for device in devices:
        try:
            stats = device.memory_stats() or {}
        except Exception:  # noqa: BLE001 - no figure, no check
            stats = {}
        if stats.get('bytes_limit') is None:
            return None, ''
        free = int(stats['bytes_limit']) - int(stats.get('bytes_in_use', 0))
        least = free if least is None else min(least, free)
    return least, f'{devices[0].device_kind} memory (its limit minus what it holds)'


def step_bytes(compiled: Any) -> dict[str, int] | None:
    """XLA's memory analysis of a compiled step, per device: {'argument', 'output', 'alias'
    (outputs written into donated arguments), 'temp'} in bytes; None where the backend gives
    none."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError):
        return None
    stats = stats[0] if isinstance(stats, list) else stats
    if stats is None:
        return None
    return {
        k: int(getattr(stats, f'{k}_size_in_bytes'))
        for k in ('argument', 'output', 'alias', 'temp')
    }


# The longest first line of `step_refusal` (the train command adds ~60 characters).
REFUSAL_CHARS = 140


def step_refusal(experiment: Experiment, compiled: Any, devices: Sequence[Any]) -> str | None:
    """Why the compiled train step cannot run on ``devices`` (all of the step's): a first line
    naming memory and the train.batch_size that would fit, under `REFUSAL_CHARS` so that the
    command's ``error:`` line stays within 200; then a line with the detail (the settings that
    decide the step's size, XLA's figures, the limit found and every remedy). None when it
    fits or where XLA or the system gives no figure.

    The step's arguments (train state, batch) are in memory already, so what it still needs
    is its outputs and temporaries less the outputs that reuse donated arguments; this
    process's CPU devices all take it from the host's memory, of which a step may take 90%
    (`_HOST_SHARE`); an accelerator's step may take all of its room. The train.batch_size
    that would fit scales the part that grows with the batch (all but the train state's size,
    for its gradient and Adam's update) to that: an estimate."""
    import jax

    local = [d for d in devices if d.process_index == jax.process_index()]
    stats = step_bytes(compiled)
    free, where = room(local)
    if stats is None or free is None:
        return None
    tc, data = experiment.train, experiment.data
    on_cpu = local[0].platform == 'cpu'
    share = len(local) if on_cpu else 1
    usable = _HOST_SHARE * free if on_cpu else free
    need = stats['output'] + stats['temp'] - stats['alias']
    if need * share <= usable:
        return None
    model_parallel = tc.model_parallelism if tc.parallelism == 'sharding' else 1
    data_parallel = max(1, len(devices) // model_parallel)
    batch = tc.batch_size // data_parallel * data.max_len * 4 * _BATCH_ARRAYS
    fixed = min(need, max(0, stats['argument'] - batch))  # the train state's size
    multiple = data_parallel * tc.grad_accum_steps
    fits = int(tc.batch_size * (usable / share - fixed) / max(1, need - fixed))
    fits = fits // multiple * multiple
    fix = (
        f'lower train.batch_size={tc.batch_size} to {fits}'
        if fits > 0
        else 'shrink the model, no train.batch_size fits beside its state'
    )
    headline = (
        f'Out of memory for the training step ({_size(need * share)} needed, '
        f'{_size(usable)} left): {fix}.'
    )
    left = f'the {_size(free)} of {where} this process may still take'
    limit = f'{_size(usable)}, {_HOST_SHARE:.0%} of {left}' if on_cpu else left
    return f'{headline}\n{_refusal_detail(experiment, stats, share, limit)}'


def _refusal_detail(experiment: Experiment, stats: dict, share: int, limit: str) -> str:
    """`step_refusal`'s second line: the settings, XLA's figures, the limit, every remedy."""
    m, tc, data = experiment.model, experiment.train, experiment.data
    need = stats['output'] + stats['temp'] - stats['alias']
    settings = (
        f'train.batch_size={tc.batch_size} x data.max_len={data.max_len} x data.vocab_size='
        f'{data.vocab_size} (train.loss_chunk_tokens={tc.loss_chunk_tokens}, '
        f'train.grad_accum_steps={tc.grad_accum_steps}, model.d_model={m.d_model})'
    )
    remedies = ["lower train.batch_size (the first line's figure is a linear estimate)"]
    if not tc.loss_chunk_tokens:
        remedies.append('set train.loss_chunk_tokens=4096 (no [tokens, vocabulary] logits)')
    remedies.append('raise train.grad_accum_steps (the same rows in smaller micro-batches)')
    if m.remat != 'full':
        remedies.append(
            f"set model.remat='full' (now {m.remat!r}: each layer recomputed in the backward pass)"
        )
    return (
        f'{settings}: the compiled training step needs {_size(stats["argument"] + need)} per '
        f"device (XLA's memory analysis: arguments {_size(stats['argument'])} + outputs "
        f'{_size(stats["output"])} + temporaries {_size(stats["temp"])} - donated '
        f'{_size(stats["alias"])}), {_size(need * share)} beyond its arguments'
        f'{f" on {share} devices" if share > 1 else ""}, more than {limit}: '
        f'{"; ".join(remedies)}.'
    )


def _size(size: int) -> str:
    return f'{size / GiB:,.1f} GiB' if size >= GiB // 10 else f'{size / 2**20:,.1f} MiB'
