"""Sampling: each output token drawn from the model's next-token distribution, sharpened or
flattened by a temperature and cut to the k most probable tokens (top-k, Fan et al., 2018) or
to the smallest set holding probability p (top-p, the nucleus; Holtzman et al., 2020), the
decoding of sampled back-translation (Edunov et al., 2018).

Seeding. The key of a sentence is ``fold_in(key(seed), line index)``, of its sample s
``fold_in(that, s)`` and of its token at position t ``fold_in(that, t)``: a sentence's
samples depend on the seed, its line index and the model only, never on the batch it is in,
its row, its bucket or the devices that decode it. Sample 0 is the same whatever the number
of samples.

One compiled program serves every setting: temperature, top-k, top-p and the seed are traced
values (`Sampling` is a traced argument; only ``num_samples`` is static, being a shape).
Top-k and top-p find their thresholds by bisection (`filter_logits`), only when one of them
is on (``lax.cond``); top-k is a traced count below the vocabulary size, no static maximum.
A token is drawn by inverse CDF (`inverse_cdf`). Shapes and the conventions of output length,
EOS, scores and ensembles are those of the package's public API
(transformer/decoding/__init__.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from transformer.decoding.constraints import Constraints, init_controls
from transformer.decoding.greedy import TokenState, token_search
from transformer.decoding.options import DEFAULT_OPTIONS, DecodeOptions
from transformer.model import Transformer

Array = jax.Array
Params = Any

MAX_SEED = 2**31 - 1  # seeds are traced as int32


@struct.dataclass
class Sampling:
    """Sampling's settings: traced values, except the number of samples (a shape)."""

    temperature: float = 1.0  # logits / temperature; > 0
    top_k: int = 0  # keep the k most probable tokens; 0 = all
    top_p: float = 1.0  # keep the nucleus of probability p; 1 = all
    seed: int = 0  # the sentence's key is fold_in(key(seed), line index)
    num_samples: int = struct.field(pytree_node=False, default=1)  # samples per input

    def check(self) -> None:
        """One line naming the setting (as its flag) when a value cannot work."""
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f'temperature must be > 0, got {self.temperature}.')
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f'top_k must be >= 1 (or 0 for all tokens), got {self.top_k}.')
        if not 0 < self.top_p <= 1:
            raise ValueError(f'top_p must be in (0, 1], got {self.top_p}.')
        if int(self.seed) != self.seed or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f'seed must be a whole number in [0, {MAX_SEED}], got {self.seed}.')
        if int(self.num_samples) != self.num_samples or self.num_samples < 1:
            raise ValueError(f'num_samples must be >= 1, got {self.num_samples}.')

    @property
    def name(self) -> str:
        """The settings as a file name part: ``sample-t1.0-k0-p1.0-seed0[-nN]``."""
        name = f'sample-t{self.temperature}-k{self.top_k}-p{self.top_p}-seed{self.seed}'
        return name + (f'-n{self.num_samples}' if self.num_samples > 1 else '')


DEFAULT = Sampling()  # the model's own distribution, seed 0, one sample


def _order_keys(x: Array) -> Array:
    """uint32 keys of float32 ``x`` in the same order (-inf lowest): the bits, all flipped for
    negative numbers and the sign bit set for the others."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _largest_threshold(keys: Array, enough) -> Array:
    """[R] the largest key t of each row with ``enough(keys >= t)``, by bisection over the 2^32
    keys (32 halvings: exact); ``enough`` holds at key 0 and only falls as t grows."""

    def halve(_, bounds):
        low, high = bounds  # enough at low; the answer lies in [low, high]
        gap = high - low
        middle = low + gap // 2 + gap % 2  # the upper middle, without overflow
        ok = enough(keys >= middle[:, None])
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle - 1)

    rows = keys.shape[0]
    bounds = (jnp.zeros(rows, jnp.uint32), jnp.full(rows, 0xFFFFFFFF, jnp.uint32))
    return jax.lax.fori_loop(0, 32, halve, bounds)[0]


def filter_logits(logits: Array, top_k: Array, top_p: Array) -> Array:
    """``logits`` [R, V] with the tokens outside the top-k and outside the nucleus at -inf.

    Top-k keeps the tokens at least as probable as the k-th; the nucleus is taken over their
    renormalised distribution (top-k first, then top-p, as Hugging Face's and fairseq's
    samplers) and keeps the most probable tokens until they hold ``top_p``: the tokens at least
    as probable as the last one needed, so the most probable token always stays. Tokens tied
    with the k-th or the last one all stay. ``top_k`` 0 keeps every token. Each threshold is
    found by bisection over the values (`_largest_threshold`): 32 masked sums over V per row,
    20x faster than a sort of [64, 8000] rows on a CPU (benchmarks/README.md).
    """
    vocab = logits.shape[-1]
    keys = _order_keys(logits)
    k = jnp.where(top_k > 0, top_k, vocab)
    in_top_k = keys >= _largest_threshold(keys, lambda kept: kept.sum(-1) >= k)[:, None]
    probs = jax.nn.softmax(jnp.where(in_top_k, logits, -jnp.inf), axis=-1)
    nucleus = _largest_threshold(keys, lambda kept: jnp.where(kept, probs, 0.0).sum(-1) >= top_p)
    return jnp.where(in_top_k & (keys >= nucleus[:, None]), logits, -jnp.inf)


def sentence_keys(seed: Array, lines: Array, samples: Array, step: Array) -> Array:
    """[R] the key of each row's token at output position ``step``."""

    def key(line, sample):
        sentence = jax.random.fold_in(jax.random.key(seed), line)
        return jax.random.fold_in(jax.random.fold_in(sentence, sample), step)

    return jax.vmap(key)(lines, samples)


def inverse_cdf(probs: Array, keys: Array) -> Array:
    """[R] one token of each row of ``probs`` [R, V] (unnormalised, >= 0), drawn with one
    uniform number per row: the first token whose cumulative probability exceeds it.

    Gumbel-max (`jax.random.categorical`) draws V random numbers and two logarithms per row
    and step; this draws one. A token of probability 0 is never drawn: its cumulative
    probability equals its predecessor's (and where float rounding puts the draw past the
    last token, the most probable one is taken).
    """
    cdf = jnp.cumsum(probs, axis=-1)
    uniform = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys)
    token = jnp.sum(cdf <= (uniform * cdf[:, -1])[:, None], axis=-1)
    token = jnp.minimum(token, probs.shape[-1] - 1)
    drawn = jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0] > 0
    return jnp.where(drawn, token, jnp.argmax(probs, axis=-1)).astype(jnp.int32)


def draw(log_probs: Array, settings: Sampling, keys: Array) -> Array:
    """[R] tokens drawn from softmax(log_probs / temperature), cut to top-k and top-p, one
    row with each key (`inverse_cdf`)."""
    scaled = log_probs / settings.temperature
    scaled = jax.lax.cond(
        (settings.top_k > 0) | (settings.top_p < 1),
        filter_logits,
        lambda x, *_: x,
        *(scaled, settings.top_k, settings.top_p),
    )
    # The row's maximum is subtracted so that no exp overflows; exp(-inf) = 0 stays 0.
    probs = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
    return inverse_cdf(probs, keys)


class _Draws(NamedTuple):
    lines: Array  # [R] the line index of each row's input
    samples: Array  # [R] which of the input's samples the row is
    log_probs: Array  # [R] the model's log P of the row's output so far
    settings: Sampling  # scalars: kept as they are when the batch shrinks


def _choose(scores: Array, state: TokenState) -> tuple[Array, _Draws]:
    d = state.draws
    keys = sentence_keys(d.settings.seed, d.lines, d.samples, state.step)
    tokens = draw(scores, d.settings, keys)
    picked = jnp.take_along_axis(scores, tokens[:, None], axis=-1)[:, 0]
    log_probs = d.log_probs + jnp.where(state.done, 0.0, picked)
    return tokens, d._replace(log_probs=log_probs)


def sample_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    sampling: Sampling = DEFAULT,
    line_indices: Array | None = None,
    options: DecodeOptions = DEFAULT_OPTIONS,
    min_stage_batch: int = 8,
    constraints: Constraints | None = None,
) -> tuple[Array, Array]:
    """``sampling.num_samples`` sampled outputs of every input.

    Args:
      model: the Transformer (static).
      params: its parameters, or an `Ensemble` (drawn from the members' mean distribution).
      inputs: right-padded source tokens [B, S] int32.
      sampling: the settings (`Sampling`); call its ``check`` first.
      line_indices: [B] each input's line index, which seeds it (default 0..B-1).
      options: the length limit, the ids never emitted, the forced first ids and the per-row
        prefixes [B, P] (`DecodeOptions`, as `greedy_search`'s; its ``eos_at_limit`` is not
        sampling's, which is always 'scored').
      min_stage_batch: the batch shrinks as its rows produce EOS, down to this many rows.
      constraints: a minimum length and n-gram blocking (`constraints.Constraints`, traced).

    Returns:
      (sequences [B, N, T] int32, log_probs [B, N] float32): the samples of each input in
      sample order, EOS included and the pad id after it, and the model's log P(y|x) of each (the
      untempered, unfiltered distribution's, EOS included).
    """
    options.check_forced(model.config.special)
    # A sample ends at its limit with EOS at the model's probability ('scored') whatever the
    # run's eos_at_limit, which is greedy and beam search's rule (docs/decoding.md).
    static = dataclasses.replace(options.static, eos_at_limit='scored')
    return _sample_search(
        model, params, inputs, sampling=sampling, line_indices=line_indices,
        options=static, prefixes=options.prefixes, min_stage_batch=min_stage_batch,
        constraints=constraints,
    )  # fmt: skip


@functools.partial(jax.jit, static_argnames=('model', 'options', 'min_stage_batch'))
def _sample_search(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    sampling: Sampling,
    line_indices: Array | None,
    options: DecodeOptions,
    prefixes: Array | None,
    min_stage_batch: int,
    constraints: Constraints | None,
) -> tuple[Array, Array]:
    """`sample_search` with its options' static part (``options``) and ``prefixes`` apart."""
    batch, width = inputs.shape
    n = sampling.num_samples
    loop_length = options.loop_length(width)
    lines = jnp.arange(batch, dtype=jnp.int32) if line_indices is None else line_indices
    draws = _Draws(
        lines=jnp.repeat(jnp.asarray(lines, jnp.int32), n),
        samples=jnp.tile(jnp.arange(n, dtype=jnp.int32), batch),
        log_probs=jnp.zeros((batch * n,), jnp.float32),
        settings=sampling,
    )
    tokens, log_probs = token_search(
        model,
        params,
        jnp.repeat(inputs, n, axis=0),
        choose=_choose,
        draws=draws,
        controls=init_controls(
            constraints, options.with_prefixes(prefixes), batch * n, loop_length, n
        ),
        loop_length=loop_length,
        options=options,
        min_stage_batch=min_stage_batch,
        normalized=True,
    )
    return tokens.reshape(batch, n, -1), log_probs.reshape(batch, n)
