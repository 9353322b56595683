"""The package from Python: build a model from a config, look at its heads, load a trained run,
translate with it and read its attention (docs/api.md walks through each).

    from transformer import api

    model, params = api.build('tiny')                 # a config name or a config file
    logits = api.logits(model, params, inputs, targets)  # teacher forcing, [B, T, V]
    w_i, fused = api.head_views(params['encoder_layer_0']['self_attention']['query']['kernel'])

    run = api.load('runs/tiny')                       # the commands' default checkpoints
    run.translate(['dinds bap koft big ze draft bap .'])
    run.translate(lines, nbest=3)                     # [[Hypothesis(text, score, log_prob)]]
    run.translate(lines, sampling=True, top_p=0.9, seed=1)  # one sample a line
    run.score(sources, targets)                       # [PairScore(score, log_prob, tokens, ...)]
    run.attention('dinds bap koft .')                 # {(stack, layer, kind): [N, T, S]}

Parameters are plain arrays; the model is called through functions of (model, parameters,
arrays), transformer/model's functional interface (`logits` here is its
``teacher_forced_logits``, compiled as one program). Loading is as quiet as the commands: the
libraries' routine notes are filtered while a run loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer import configs, data, decoding, schema
from transformer.commands import console, decoding_run
from transformer.model import (
    Transformer,
    attention_maps,
    config_from_dict,
    fused,
    init_params,
    per_head,
    teacher_forced_logits,
)

Hypothesis = decoding.Hypothesis
PairScore = decoding.PairScore
__all__ = [
    'Hypothesis',
    'PairScore',
    'Run',
    'attention_maps',
    'build',
    'config',
    'head_views',
    'load',
    'logits',
]


# One compiled program per model and shapes: run op by op, each of the forward pass's
# operations compiled on its own (the tiny config's first call took 4 times as long on a CPU)
# and was dispatched again on every later call.
logits = jax.jit(teacher_forced_logits, static_argnames='model')


def config(name_or_path: str) -> ml_collections.ConfigDict:
    """An experiment config: a packaged one by name ('tiny', 'base', ...) or a file's."""
    return configs.load(name_or_path)


def build(
    experiment: str | schema.Config,
    vocab_size: int | None = None,
    seed: int = 0,
) -> tuple[Transformer, Any]:
    """The model of a config and freshly initialised parameters (the training init).

    Args:
      experiment: a config name, a config file, a config or a parsed one.
      vocab_size: the vocabulary size (default: the config's ``data.vocab_size``).
      seed: the initialisation seed.

    Raises:
      schema.ConfigError: a config value that cannot work, in one line naming its key (the
        commands' check, `schema.parse`).
    """
    cfg = config(experiment) if isinstance(experiment, str) else experiment
    typed = cfg if isinstance(cfg, schema.Experiment) else schema.parse(cfg)
    model = Transformer(config_from_dict(typed.model, vocab_size or typed.data.vocab_size))
    params = jax.jit(lambda rng: init_params(model, rng))(jax.random.key(seed))
    return model, params


def head_views(kernel: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A query, key or value kernel [D, N, H] seen both ways: head i's own ``W_i`` is
    ``per_head[i]`` ([D, H]), and ``fused`` [D, N*H] is the matrix of "one big linear layer".
    Both are views of the same parameter."""
    return per_head(kernel), fused(kernel)


@dataclasses.dataclass
class Run:
    """A trained run loaded for use: its config, vocabulary, model and parameters."""

    config: schema.Experiment
    tokenizer: data.Tokenizer
    model: Transformer
    params: Any
    steps: list[int]  # the checkpoints loaded (averaged when several)
    # The mesh it decodes on (`decoding.DecodeLayout`; None: one device), params in its layout.
    layout: decoding.DecodeLayout | None = None
    forced: tuple[int, ...] = ()  # the ids every output starts with: the load's target code

    def translate(
        self,
        lines: Sequence[str],
        *,
        beam_size: int | None = None,
        alpha: float | None = None,
        length_penalty: str | None = None,
        nbest: int = 0,
        batch_size: int | None = None,
        sampling: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        num_samples: int = 1,
        min_length: int = 0,
        no_repeat_ngram: int = 0,
        prefixes: Sequence[str] | None = None,
        source_tag: str | None = None,
        source_lang: str | None = None,
        target_lang: str | None = None,
    ) -> list[str] | list[list[Hypothesis]]:
        """Translations of ``lines`` (one per line, '' for a blank one), or with ``nbest`` K
        the K best `Hypothesis` of each; decoding settings default to the run's config.
        ``length_penalty`` is the rule, 'gnmt' or 'fairseq' (`decoding.length_penalty`); a new
        ``alpha`` or rule reuses the search already compiled for this beam and batch shape.

        ``sampling`` draws the outputs instead (``temperature``, ``top_k`` (0 = all tokens),
        ``top_p``; line i seeded by fold_in(key(``seed``), i)); with ``num_samples`` N > 1
        each line gets its N samples as `Hypothesis` lists, in sample order. ``min_length``
        and ``no_repeat_ngram`` constrain any search; ``prefixes`` (one a line, '' = none)
        are target text each output starts with. ``source_tag``: a token put first in every
        source (a multilingual model's target language, '>>fra<<'; `data.tag_sources`).
        ``source_lang``, ``target_lang``: a pair of a run with language codes, as the
        commands' flags (default: the load's; `data.languages_of`). A new value of any of
        these reuses the compiled search. Settings that cannot work raise a one-line
        ValueError before anything is decoded.
        """
        ev = self.config.eval
        if sampling and beam_size not in (None, 1):
            raise ValueError(f'sampling draws outputs; it takes no beam_size={beam_size}.')
        settings = (
            decoding.Sampling(temperature, top_k, top_p, seed, num_samples) if sampling else None
        )
        constraints = decoding.Constraints(min_length, no_repeat_ngram)
        constraints.check()
        tokenizer, options = self._decoding(
            alpha, length_penalty, source_tag, source_lang, target_lang
        )
        return decoding.translate_lines(
            *(list(lines), tokenizer, self.model, self.params),
            beam_size=ev.beam_size if beam_size is None else beam_size,
            options=options,
            batch_size=batch_size or ev.batch_size,
            **dict(max_input_tokens=self.config.data.max_len, nbest=nbest),
            sampling=settings,
            constraints=constraints if constraints.active else None,
            prefixes=None if prefixes is None else list(prefixes),
            layout=self.layout,
        )

    def _decoding(self, alpha, length_penalty, *languages: str | None) -> tuple[Any, Any]:
        """(the vocabulary, the `decoding.DecodeOptions`) of a call's settings."""
        chosen = self._languages(*languages)
        ev = self.config.eval
        penalty = dict(alpha=alpha, length_penalty=length_penalty)
        return chosen.tokenizer, decoding.decode_options(ev, **penalty, forced=chosen.forced)

    def _languages(
        self, source_tag: str | None, source_lang: str | None, target_lang: str | None
    ) -> data.Languages:
        """The vocabulary with ``source_tag`` or the source code first in every source and
        the forced target code (`data.languages_of`, whose `data.DataError` is a
        ValueError); the load's where a call names none."""
        if source_tag is None and source_lang is None and target_lang is None:
            if self.forced or isinstance(self.tokenizer, data.SourceTagged):
                return data.Languages(self.tokenizer, self.forced)
        vocabulary = self.tokenizer
        if isinstance(vocabulary, data.SourceTagged):
            vocabulary = vocabulary.tokenizer
        return data.languages_of(
            vocabulary, source_lang, target_lang, source_tag=source_tag,
            data_config=self.config.data,
        )  # fmt: skip

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        alpha: float | None = None,
        length_penalty: str | None = None,
        batch_size: int | None = None,
        source_tag: str | None = None,
        source_lang: str | None = None,
        target_lang: str | None = None,
    ) -> list[decoding.PairScore]:
        """The model's score of each (source, target) pair: `PairScore` (score, log_prob,
        tokens, token_log_probs), log_prob being log P(target | source) with EOS, score that
        over the run's length penalty (``alpha`` and the rule default to its config). With a
        language pair (as `translate`'s) each target starts with its code, whose
        log-probability and token count are included, as Hugging Face's loss counts them."""
        ev = self.config.eval
        tokenizer, options = self._decoding(
            alpha, length_penalty, source_tag, source_lang, target_lang
        )
        return decoding.score_pairs(
            self.model,
            self.params,
            tokenizer,
            list(sources),
            list(targets),
            options=options,
            batch_size=batch_size or ev.batch_size,
            layout=self.layout,
        )

    def attention(self, source: str, target: str | None = None) -> dict[tuple, np.ndarray]:
        """Every head's attention for one sentence pair: {(stack, layer, kind): [N, T, S]}
        with T and S counting the pieces of target and source and their EOS. ``target``
        defaults to the greedy translation of ``source``."""
        if target is None:
            target = self.translate([source], beam_size=1)[0]
        inputs, targets = (
            np.array(self.tokenizer.encode(text, side) + [self.tokenizer.special.eos], np.int32)
            for text, side in ((source, 'source'), (target, 'target'))
        )
        return attention_maps(self.model, self.params, inputs, targets)


def load(
    workdir: str,
    *,
    step: int | None = None,
    average_last: int | None = None,
    best: bool = False,
    devices: Sequence[Any] | None = None,
    source_tag: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    **layout: Any,
) -> Run:
    """A trained run, loaded as the commands load it (by default the average they choose:
    `checkpoint.default_average`); ``step``, ``average_last`` and ``best`` as their flags.
    It decodes on ``devices`` (default: all) in the run's layout, as evaluate and translate
    do; ``layout``: ``parallelism``, ``model_parallelism``, ``fsdp``, ``gather_params`` as
    their flags. ``source_tag``: the token every source starts with (a multilingual model's
    target language); ``source_lang`` and ``target_lang``: a run with language codes' pair
    (default: the one it records; an unknown code is one-line `data.DataError`); each of
    these `Run.translate` and `Run.score` may also take per call."""
    with console.quiet_libraries():
        loaded = decoding_run.load_run(
            workdir,
            **dict(step=step, average_last=average_last, best=best, devices=devices),
            **dict(source_tag=source_tag, tag_later=True),
            **dict(source_lang=source_lang, target_lang=target_lang),
            **layout,
        )
    steps = loaded.member_steps[0]
    return Run(
        *(loaded.config, loaded.tokenizer, loaded.model, loaded.params, steps, loaded.layout),
        loaded.forced,
    )
