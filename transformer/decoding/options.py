"""How a search decodes, as one value: `DecodeOptions`, built from a run's ``eval`` section
and the command's flags by `decode_options`, and given to every search, the scoring of given
translations and the functions that decode lines of text.

Under jit a search takes the options' static part (`DecodeOptions.static`: hashable, each
value compiles its own program) and their traced part as arrays: the length penalty's
exponent and rule (a new one runs the program already compiled) and the per-row prefixes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from transformer.schema import EOS_AT_LIMIT, LENGTH_PENALTIES
from transformer.tokens import SpecialIds


def penalty_rule(rule: str) -> np.int32:
    """The rule's number, its place in `schema.LENGTH_PENALTIES` ('gnmt' 0, 'fairseq' 1): the
    searches take it as a traced value, so one compiled search serves both rules."""
    if rule not in LENGTH_PENALTIES:
        raise ValueError(f'eval.length_penalty must be one of {LENGTH_PENALTIES}, got {rule!r}.')
    return np.int32(LENGTH_PENALTIES.index(rule))


def penalty_alpha(alpha: float) -> np.float32:
    """``alpha`` as the searches take it (a traced float32), refused when negative: beam
    search's early stop bounds an alive hypothesis by the penalty at the output limit, which
    holds only while the penalty grows with the length (alpha >= 0)."""
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be >= 0 (the length penalty's exponent), got {alpha}.")
    return np.float32(alpha)


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """What every search decodes by, beyond the model and its inputs (the conventions are
    written in `transformer.decoding`'s docstring).

    Attributes:
      extra_length: an output may hold its input's length + this many tokens, EOS included
        and the decoder's start token not (Sec. 6.1: 50).
      max_decode_len: the loop length T; None: the padded source width + ``extra_length``.
      alpha: the length penalty's exponent (traced).
      length_penalty: its rule, 'gnmt' or 'fairseq' (`next_token.length_penalty`; traced).
      eos_at_limit: at an output's last allowed position, 'scored': only EOS, at the model's
        probability of it; 'forced': only EOS, at probability 1, as Hugging Face's
        ``forced_eos_token_id``; 'none': any token, the output ending there without EOS.
      renormalize: beam search takes log_softmax again over the tokens still allowed
        (Hugging Face's ``renormalize_logits``); greedy search and sampling pick the same
        tokens either way.
      never_emit: ids no search outputs unless forced; None: the vocabulary's
        (``special.never_emit``, the pad id always).
      forced: ids every output starts with, before any per-row prefix (a target-language
        code: NLLB-200's ``deu_Latn``, Hugging Face's ``forced_bos_token_id``). They come
        after the decoder's start token, which is never output, and are part of the output:
        the output, its length and its score hold them, each at the model's own
        log-probability (0 with ``renormalize``, the only token allowed there). An id of
        ``never_emit`` may be forced.
      prefixes: [B, P] int32 per-row target prefixes after ``forced``, right-padded with the
        pad id (traced, split over a mesh with the rows); given to
        `translation.translate_batches` and `translation.nbest_batches`, one id array an
        example, indexed as the batches' ``index``.
    """

    extra_length: int = 50
    max_decode_len: int | None = None
    alpha: float = dataclasses.field(default=0.6, compare=False)
    length_penalty: str = dataclasses.field(default='gnmt', compare=False)
    eos_at_limit: str = 'scored'
    renormalize: bool = False
    never_emit: tuple[int, ...] | None = None
    forced: tuple[int, ...] = ()
    prefixes: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.eos_at_limit not in EOS_AT_LIMIT:
            raise ValueError(
                f'eval.eos_at_limit must be one of {EOS_AT_LIMIT}, got {self.eos_at_limit!r}.'
            )
        if int(self.extra_length) != self.extra_length or self.extra_length < 0:
            raise ValueError(f'extra_length must be a whole number >= 0, got {self.extra_length}.')
        for name in ('forced', 'never_emit'):
            ids = getattr(self, name)
            if ids is not None:
                if any(int(i) != i or i < 0 for i in ids):
                    raise ValueError(f'{name} must be token ids >= 0, got {tuple(ids)}.')
                object.__setattr__(self, name, tuple(int(i) for i in ids))

    @property
    def static(self) -> DecodeOptions:
        """What a search compiles by (hashable, a jit static argument): the options without
        their traced parts."""
        return dataclasses.replace(self, alpha=0.0, length_penalty='gnmt', prefixes=None)

    def penalty(self) -> tuple[np.float32, np.int32]:
        """(alpha, rule) as traced values; a bad one stops in one line."""
        return penalty_alpha(self.alpha), penalty_rule(self.length_penalty)

    def banned(self, special: SpecialIds) -> tuple[int, ...]:
        """The ids no search outputs unless forced."""
        return special.never_emit if self.never_emit is None else self.never_emit

    def loop_length(self, width: int) -> int:
        """The loop length T: ``max_decode_len``, else the padded source width + extra."""
        return self.max_decode_len if self.max_decode_len is not None else width + self.extra_length

    def with_prefixes(self, prefixes: Any) -> DecodeOptions:
        return dataclasses.replace(self, prefixes=prefixes)

    def check_forced(self, special: SpecialIds) -> None:
        """One line when the forced ids cannot be forced: the pad id marks "not forced", an
        output that starts with EOS has ended, and an output of the shortest source (its EOS
        alone) must still hold them and its EOS."""
        if special.pad in self.forced or special.eos in self.forced:
            raise ValueError(
                f'forced ids {self.forced} hold the pad id {special.pad} or the EOS id '
                f'{special.eos}: force the tokens an output starts with.'
            )
        if len(self.forced) > self.extra_length:
            raise ValueError(
                f'{len(self.forced)} forced ids leave no room for EOS within extra_length='
                f'{self.extra_length}: raise eval.extra_length.'
            )


DEFAULT_OPTIONS = DecodeOptions()  # the paper's: input length + 50, GNMT's alpha 0.6


def decode_options(
    ev: Any,
    *,
    alpha: float | None = None,
    length_penalty: str | None = None,
    forced: tuple[int, ...] = (),
    never_emit: tuple[int, ...] | None = None,
) -> DecodeOptions:
    """The `DecodeOptions` of a run's ``eval`` section, with a command's ``alpha`` and
    ``length_penalty`` (None: the run's) and the ``forced`` first ids of its target
    language."""
    return DecodeOptions(
        extra_length=ev.extra_length,
        alpha=ev.alpha if alpha is None else alpha,
        length_penalty=length_penalty or ev.length_penalty,
        eos_at_limit=getattr(ev, 'eos_at_limit', None) or 'scored',
        renormalize=bool(getattr(ev, 'renormalize', False)),
        never_emit=never_emit,
        forced=tuple(forced),
    )
