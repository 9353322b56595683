"""The ``eval`` section: how a run decodes (the searches' settings) and how it is scored.

Its choices are written here once: the length penalty's rule, what the searches do at an
output's length limit, and the validation metric.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from transformer.fields import NON_NEGATIVE, POSITIVE, Section, field

# Validation scores, higher = better (transformer/evaluation/bleu.py's keys).
BestMetric = Literal['sacrebleu', 'tokenized_bleu', 'chrf', 'chrf++']
# Beam search's length penalty (transformer/decoding/next_token.py): GNMT's or fairseq's.
LengthPenalty = Literal['gnmt', 'fairseq']
# What the searches do at an output's length limit (transformer/decoding/next_token.py).
EosAtLimit = Literal['scored', 'forced', 'none']

METRICS: tuple[str, ...] = get_args(BestMetric)
LENGTH_PENALTIES: tuple[str, ...] = get_args(LengthPenalty)
EOS_AT_LIMIT: tuple[str, ...] = get_args(EosAtLimit)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection(Section):
    SECTION = 'eval'
    beam_size: int = field(4, POSITIVE, doc='Sec. 6.1')
    alpha: float = field(
        0.6, NON_NEGATIVE, doc="the length penalty's exponent (Sec. 6.1); 0 = no penalty"
    )
    length_penalty: LengthPenalty = field(
        'gnmt', optional=True, doc="'gnmt': ((5 + len) / 6)^alpha; 'fairseq': len^alpha"
    )
    extra_length: int = field(
        50, NON_NEGATIVE, doc='maximum output length = input length + 50 (Sec. 6.1)'
    )
    # At an output's last position: only EOS at its probability ('scored'), only EOS at
    # probability 1 ('forced': Hugging Face's forced_eos_token_id), or any token, the output
    # ending there without EOS ('none'); docs/decoding.md.
    eos_at_limit: EosAtLimit = field(
        'scored', optional=True, doc="at the length limit: 'scored' | 'forced' EOS, or 'none'"
    )
    renormalize: bool = field(
        False,
        optional=True,
        doc="beam log-probs renormalised after banning tokens (Hugging Face's renormalize_logits)",
    )
    average_last: int = field(5, POSITIVE, doc='average the last 5 checkpoints (Sec. 6.1)')
    batch_size: int = field(64, POSITIVE, doc='sentences per decoding / validation batch')
    bleu_every: int = field(
        0, NON_NEGATIVE, doc='steps between validation BLEU during training (0 = off)'
    )
    bleu_max_examples: int = field(
        0, NON_NEGATIVE, optional=True, doc='validation sentences decoded for that BLEU (0 = all)'
    )
    best_metric: BestMetric = field(
        'sacrebleu',
        optional=True,
        doc="'sacrebleu' | 'tokenized_bleu' | 'chrf' | 'chrf++': picks WORKDIR/best",
    )
    # Tokenized BLEU's conventions (transformer/evaluation/bleu.py).
    compound_split: bool = field(
        True, optional=True, doc="tokenized BLEU with t2t's ##AT## hyphen splitting (WMT14 EN-DE)"
    )
    lowercase_tokenized: bool = field(
        False, optional=True, doc='tokenized BLEU on lowercased, punct-normalised text'
    )
