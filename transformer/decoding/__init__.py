"""Decoding a trained model: greedy search, beam search and sampling over the decoder's
key/value cache, and the model's score of given translations.

Modules: options.py (`DecodeOptions`: how a search decodes, one value built from a run's
``eval`` section and the command's flags by `decode_options`), next_token.py (the step the
searches share; `Ensemble`), greedy.py (greedy search
and the one-token-per-step loop it shares with sampling), sampling.py (temperature, top-k,
top-p; `Sampling`), beam.py (beam search), constraints.py (minimum length, n-gram blocking,
forced prefixes; `Constraints`), search.py (`translate_batch`: which search, by the beam size
and the sampling settings), ensemble.py (several runs as one model), translation.py (lines of
text in, lines out), scoring.py (log P(target | source) of given pairs), mesh.py
(`decode`: any search on every device of a run's mesh and over its processes).
Callers import its public API: ``from transformer import decoding``.

Conventions shared by the searches (each setting named here is a field of `DecodeOptions`):

* Output length. The paper decodes up to "input length + 50" tokens (Sec. 6.1). An example's
  limit is its own input length (its non-pad tokens, EOS included, so inputs must be
  right-padded and unpacked) plus ``extra_length``, counting the output's EOS and not the
  start token. Shapes must be static under jit, so the loop length is taken from the padded
  width S: T = S + extra_length, or ``max_decode_len`` when given; an example stops at
  min(limit, T) by allowing only EOS at its last position (scored at the model's probability
  of it; ``eval.eos_at_limit`` 'forced' scores it at probability 1 and 'none' lets the output
  end there without EOS, as Hugging Face's ``generate`` does with and without
  ``forced_eos_token_id``). Output arrays are [.., T] and only
  the number of real tokens depends on the data, so equal shapes never recompile.
* Special ids are the vocabulary's (`tokens.SpecialIds`), which the searches read from the
  model's config (``model.config.special``, recorded in the run's config.json). The first
  step feeds the decoder's start token (the joint vocabulary's pad, 0; NLLB-200's eos); it is
  never part of the output. EOS is kept in the output and everything after it is the pad id.
  No search outputs an id of ``special.never_emit`` (the pad id always: a pad inside a
  hypothesis would read as padding to the teacher-forced model; ``DecodeOptions.never_emit``
  may name others) unless it is forced. Forced first target tokens (``DecodeOptions.forced``,
  a target-language code), then a row's own prefix, are a prefix (constraints.py): they
  come out first, count in the output's length limit, and their log-probabilities count in
  the score like any other token's (`score_pairs` counts them in a given target too).
* Scores are sum of log-probabilities (EOS included) / length_penalty(length), the length
  counting EOS and not the start token: GNMT's ((5 + length) / 6)^alpha or fairseq's
  length^alpha (``eval.length_penalty``, `next_token.length_penalty`). Log-probabilities
  are the model's own (log_softmax over all of V), not renormalised after forbidding
  ``never_emit`` or forcing EOS or a prefix, so a score is always the model's
  log-probability of exactly that sequence over its penalty (Hugging Face's default,
  ``renormalize_logits`` false). With ``eval.renormalize`` beam search takes log_softmax
  again over the tokens still allowed at each step (``renormalize_logits`` true).
* Ensembles. ``params`` may be an `Ensemble` of M models of one architecture
  (`ensemble_params`): the next-token distribution is then the mean of the members'
  probabilities (`next_token.Ensemble`), and scores are that mixture's log-probability of
  the sequence over the length penalty.
"""

from transformer.decoding.beam import beam_search
from transformer.decoding.constraints import Constraints
from transformer.decoding.ensemble import load_ensemble
from transformer.decoding.greedy import greedy_search
from transformer.decoding.mesh import (
    DecodeLayout,
    decode,
    gather,
    place_rows,
    sentences_per_process,
)
from transformer.decoding.next_token import (
    Ensemble,
    ensemble_params,
    length_penalty,
    length_power,
)
from transformer.decoding.options import DecodeOptions, decode_options
from transformer.decoding.sampling import Sampling, sample_search
from transformer.decoding.scoring import PairScore, format_scores, score_pairs
from transformer.decoding.search import hypotheses_batch, translate_batch
from transformer.decoding.translation import (
    Hypothesis,
    format_nbest,
    nbest_batches,
    translate_batches,
    translate_lines,
)

__all__ = [
    'DecodeLayout',
    'Constraints',
    'DecodeOptions',
    'Ensemble',
    'Hypothesis',
    'PairScore',
    'Sampling',
    'beam_search',
    'decode',
    'decode_options',
    'ensemble_params',
    'format_nbest',
    'gather',
    'format_scores',
    'greedy_search',
    'hypotheses_batch',
    'length_penalty',
    'length_power',
    'load_ensemble',
    'nbest_batches',
    'place_rows',
    'sentences_per_process',
    'sample_search',
    'score_pairs',
    'translate_batch',
    'translate_batches',
    'translate_lines',
]
