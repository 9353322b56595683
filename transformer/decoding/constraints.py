"""What a search may output besides the model's choice: a minimum length, no repeated n-gram,
and a forced target prefix, the same for beam search, greedy search and sampling.

* ``min_length`` L: EOS is forbidden while fewer than L tokens precede it (fairseq's
  ``--min-len``), except at an example's last allowed position, where the output limit
  (`next_token.output_limits`) wins and EOS is the only token left.
* ``no_repeat_ngram`` N: a token that would complete an N-gram already in the output is
  forbidden (fairseq's ``--no-repeat-ngram-size``, Paulus et al., 2018); 0 turns it off.
* A prefix [B, P] (right-padded with the pad id): output position t < the row's prefix length
  takes the prefix's token, whatever the model prefers (even an id of ``never_emit``); its
  score is the model's log-probability of that token, so a score is still the model's
  log-probability of the whole output. A row's prefix is `DecodeOptions.forced` (a
  vocabulary's forced first target tokens, a target-language code: NLLB-200's) followed by
  its own ``DecodeOptions.prefixes`` row: they come out first in the output, after the
  decoder's start token (`SpecialIds.decoder_start`, which is never part of the output), and
  count in its score and length like any other token. The caller makes sure a prefix leaves
  room for EOS (`translation.encode_prefixes`).

Both settings are traced values (one compiled search serves every L and N); a prefix is an
array, so its contents are too. N-gram blocking keeps, for every row, the length of the
common suffix of its output before position j and its whole output (``matches`` [R, T]):
a token at j is forbidden next when that common suffix holds N - 1 tokens. One shift and
compare per step keeps it, rather than comparing every (N-1)-gram at every step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from transformer.decoding.options import DecodeOptions
from transformer.tokens import SpecialIds

Array = jax.Array


@struct.dataclass
class Constraints:
    """A minimum output length and an n-gram size that may not repeat (0 = off for both).

    Passed to the searches as a traced argument: a new value runs the compiled program."""

    min_length: int = 0
    no_repeat_ngram: int = 0

    def check(self) -> None:
        """One line naming the setting when a value cannot work."""
        for name, value in (
            ('min_length', self.min_length),
            ('no_repeat_ngram', self.no_repeat_ngram),
        ):
            if int(value) != value or value < 0:
                raise ValueError(f'{name} must be a whole number >= 0, got {value}.')

    @property
    def active(self) -> bool:
        return bool(self.min_length or self.no_repeat_ngram)


class Controls(NamedTuple):
    """What a search carries for its constraints and prefixes, one row per hypothesis."""

    min_length: Array | None  # scalar int32
    ngram: Array | None  # scalar int32
    matches: Array | None  # [R, T] common suffix lengths (see the module docstring)
    prefix: Array | None  # [R, P] forced tokens, the pad id past each row's prefix


def forced_prefix(options: DecodeOptions, rows: int, repeat: int = 1) -> Array | None:
    """[rows, F + P] int32: ``options.forced`` (F ids, the same for every row) followed by
    each row's ``options.prefixes`` [rows / repeat, P], each repeated to its ``repeat`` rows
    (beams, samples); None when there is neither."""
    prefixes = options.prefixes
    if prefixes is not None:
        prefixes = jnp.repeat(jnp.asarray(prefixes, jnp.int32), repeat, axis=0)
    if not options.forced:
        return prefixes
    forced = jnp.broadcast_to(jnp.asarray(options.forced, jnp.int32), (rows, len(options.forced)))
    return forced if prefixes is None else jnp.concatenate([forced, prefixes], axis=1)


def init_controls(
    constraints: Constraints | None,
    options: DecodeOptions,
    rows: int,
    loop_length: int,
    repeat: int = 1,
) -> Controls | None:
    """The controls of ``rows`` rows, each example's ``repeat`` times (`forced_prefix`), or
    None when the search has neither constraints nor forced tokens (then it compiles as
    without them)."""
    prefix = forced_prefix(options, rows, repeat)
    if constraints is None and prefix is None:
        return None
    if constraints is None:
        return Controls(None, None, None, prefix)
    return Controls(
        min_length=jnp.asarray(constraints.min_length, jnp.int32),
        ngram=jnp.asarray(constraints.no_repeat_ngram, jnp.int32),
        matches=jnp.zeros((rows, loop_length), jnp.int32),
        prefix=prefix,
    )


def forced_tokens(prefix: Array, step: Array, pad: int) -> Array:
    """[R] the prefix token of output position ``step`` (``pad``: not forced)."""
    width = prefix.shape[1]
    token = jax.lax.dynamic_index_in_dim(prefix, jnp.minimum(step, width - 1), 1, keepdims=False)
    return jnp.where(step < width, token, pad)


def _repeated(controls: Controls, step: Array, tokens: Array, vocab: int) -> Array:
    """[R, V] the tokens that would complete an n-gram already in ``tokens``."""
    positions = jnp.arange(tokens.shape[1])
    hit = (positions < step) & (controls.matches >= controls.ngram - 1) & (controls.ngram > 0)
    rows = jnp.arange(tokens.shape[0])[:, None]
    counts = jnp.zeros((tokens.shape[0], vocab), jnp.int32).at[rows, tokens].add(hit)
    return counts > 0


def constrain(
    scores: Array,
    controls: Controls | None,
    step: Array,
    tokens: Array,
    at_limit: Array,
    special: SpecialIds,
    raw: Array | None = None,
) -> Array:
    """``scores`` [R, V] (already through `next_token.forbid`) with what the constraints
    forbid at -inf, and forced positions holding only their prefix token, at its score in
    ``raw`` (the scores before `next_token.forbid`, default ``scores``: a forced id is
    forced even when the vocabulary never emits it).

    Args:
      scores: next-token scores (log-probabilities or logits) [R, V].
      controls: `init_controls`' (None: ``scores`` as they are).
      step: the output position about to be chosen.
      tokens: [R, T] each row's output so far (positions >= ``step`` are ignored).
      at_limit: [R] rows whose next token is their last allowed one (only EOS is left).
      special: the vocabulary's ids (its eos; its pad pads a prefix).
      raw: [R, V] the scores before `next_token.forbid`.
    """
    if controls is None:
        return scores
    vocab = jnp.arange(scores.shape[-1])
    out = scores
    if controls.min_length is not None:
        early = (step < controls.min_length) & ~at_limit
        out = jnp.where(early[:, None] & (vocab == special.eos), -jnp.inf, out)
        out = jnp.where(_repeated(controls, step, tokens, scores.shape[-1]), -jnp.inf, out)
    if controls.prefix is not None:
        forced = forced_tokens(controls.prefix, step, special.pad)[:, None]
        only = jnp.where(vocab == forced, scores if raw is None else raw, -jnp.inf)
        out = jnp.where(forced != special.pad, only, out)
    return out


def advance(controls: Controls | None, tokens: Array, new_tokens: Array) -> Controls | None:
    """The controls once each row's output ``tokens`` [R, T] (positions < step) is followed
    by ``new_tokens`` [R] at position step: M'[j] = M[j-1] + 1 where token j-1 equals the
    new token, else 0."""
    if controls is None or controls.matches is None:
        return controls
    shifted_tokens = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    shifted = jnp.pad(controls.matches[:, :-1], ((0, 0), (1, 0)))
    matches = jnp.where(shifted_tokens == new_tokens[:, None], shifted + 1, 0)
    return controls._replace(matches=matches)


def take_rows(controls: Controls | None, rows: Array) -> Controls | None:
    """The controls of ``rows`` (beam search's parents): the n-gram matches follow them."""
    if controls is None:
        return None
    if controls is None or controls.matches is None:
        return controls
    # A prefix is the same for all K rows of an example, and parents are of the same example.
    return controls._replace(matches=jnp.take(controls.matches, rows, axis=0))
