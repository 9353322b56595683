"""A lower bound on the memory a config needs, checked before a run builds anything.

A length or a batch far beyond what the machine holds (``data.max_len=1000000000``) used to
fail after the run directory was written, in numpy's or XLA's allocator ("Unable to allocate
119. GiB"). `check` refuses it first, in one line naming the settings. The figures are
lower bounds, not a model of XLA's temporaries: only what a step cannot do without (the
layers' weights with their gradient and Adam's two moments, the residual stream of every layer
kept for the backward pass, the host's batch arrays, a decoder's key/value cache), so a
config refused here can never run, and one that passes may still run out of memory (that
ends in the commands' own one-line error).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from transformer.schema import ConfigError, Experiment

GiB = 2**30
# int32 arrays a packed training batch holds per token (inputs, targets, segmentations,
# positions of each side).
_BATCH_ARRAYS = 6
# Copies of each parameter a train step holds: the value, its gradient, Adam's two moments.
_PARAM_COPIES = 4
HOST = 'the batch arrays'  # the part that lives in host memory


def layer_params(experiment: Experiment) -> int:
    """The weight matrices of the model's layers (attention and feed-forward). The embeddings
    are left out: the vocabulary may end up smaller than data.vocab_size."""
    m = experiment.model
    d, f = m.d_model, m.d_ff
    inner = m.num_heads * (m.head_dim or d // m.num_heads)
    attention = 4 * d * inner
    ffn = 2 * d * f
    return m.num_encoder_layers * (attention + ffn) + m.num_decoder_layers * (2 * attention + ffn)


def _itemsize(dtype: Any) -> int:
    import jax.numpy as jnp

    return jnp.dtype(dtype).itemsize


def needs(experiment: Experiment, num_devices: int) -> dict[str, tuple[int, str]]:
    """Bytes each part of a training run needs at least, per device (`HOST`: in host
    memory), with the settings that decide it: {part: (bytes, settings)}."""
    m, tc = experiment.model, experiment.train
    length = experiment.data.max_len
    model_parallel = tc.model_parallelism if tc.parallelism == 'sharding' else 1
    data_parallel = max(1, num_devices // model_parallel)
    rows = max(1, tc.batch_size // (data_parallel * tc.grad_accum_steps))
    size = _itemsize(m.dtype)
    params = _PARAM_COPIES * layer_params(experiment) * _itemsize(m.param_dtype)
    if tc.fsdp or model_parallel > 1:
        params //= max(1, model_parallel * (data_parallel if tc.fsdp else 1))
    layers = m.num_encoder_layers + m.num_decoder_layers
    ev = experiment.eval
    # A search runs for the source's length + extra_length steps, and a source has a token.
    cache = decode_cache_bytes(experiment, ev.batch_size, ev.beam_size, 1 + ev.extra_length)
    return {
        "the layers' weights with their gradient and Adam's moments": (
            params,
            f'model.d_model={m.d_model}, model.d_ff={m.d_ff} and {layers} layers',
        ),
        "the layers' activations": (
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
    }


def decode_cache_bytes(experiment: Experiment, sentences: int, beam: int, length: int) -> int:
    """The decoder's key/value cache for ``sentences`` x ``beam`` hypotheses of ``length``."""
    m = experiment.model
    inner = m.num_heads * (m.head_dim or m.d_model // m.num_heads)
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


def check(experiment: Experiment, devices: Sequence[Any]) -> None:
    """`ConfigError` naming the settings when a part alone needs more than the machine has."""
    per_device, where = device_bytes(devices)
    host = host_bytes()
    for part, (size, settings) in needs(experiment, len(devices)).items():
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
) -> None:
    """`ConfigError` naming ``--beam_size`` / ``--batch_size`` for a search that cannot work
    (evaluate, translate): a beam wider than the vocabulary, or a decoder cache of
    ``sentences`` x ``beam`` hypotheses that alone exceeds the memory of the device that
    decodes (default: this process's first). ``beam_flag``: the flag that set the beam
    (translate's ``--nbest`` K searches with a beam of at least K)."""
    if devices is None:
        import jax

        devices = jax.local_devices()[:1]
    if beam > vocab_size:
        raise ConfigError(
            f'{beam_flag}={beam} exceeds the vocabulary of {vocab_size} pieces: a beam cannot '
            'hold more hypotheses than the first step has words.'
        )
    length = 1 + experiment.eval.extra_length
    size = decode_cache_bytes(experiment, sentences, beam, length)
    limit, where = device_bytes(devices)
    if limit is not None and size > limit:
        raise ConfigError(
            f'--batch_size={sentences} sentences x {beam_flag}={beam} x (1 + eval.extra_length='
            f'{experiment.eval.extra_length}) tokens: the decoder cache alone needs at least '
            f'{size / GiB:,.1f} GiB, more than the {limit / GiB:,.1f} GiB of {where}; lower them.'
        )
