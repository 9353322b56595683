"""The config's sections as frozen, typed dataclasses: each field with its default, rule and
one-line description (`fields.field`), and the rules between sections (`Experiment`).

The defaults are the paper's base model and its training (Vaswani et al., 2017), on the
built-in synthetic data (offline and small); configs/base.py adds the paper's WMT14 data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, get_args

from transformer import data as data_lib
from transformer.data import LONG_EXAMPLES, MODEL_TYPES, NORMALIZATIONS, PRETOKENIZERS, DataError
from transformer.data import mix_entries as data_mix
from transformer.data import sources as data_sources
from transformer.fields import (
    ABOVE_ZERO,
    AT_LEAST_2,
    AT_LEAST_4,
    MAX_INIT_TIMEOUT,
    MAX_SEED,
    MAX_STEP,
    MAX_VOCAB,
    NON_NEGATIVE,
    POSITIVE,
    RATE,
    ConfigError,
    Section,
    field,
)
from transformer.model import TransformerConfig
from transformer.schema.eval_section import EvalSection
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID, SpecialIds

# The paper's warm-up + inverse square root; a constant; fairseq's inverse_sqrt.
Schedule = Literal['rsqrt', 'constant', 'inverse_sqrt']
DropoutPrng = Literal['threefry', 'rbg', 'unsafe_rbg', 'philox4x32']
Parallelism = Literal['pmap', 'sharding']  # transformer/training/parallel.py
VocabModelType = Literal[MODEL_TYPES]
VocabNormalization = Literal[NORMALIZATIONS]
Pretokenize = Literal[PRETOKENIZERS]  # transformer/data/pretokenize.py
LongExamples = Literal[LONG_EXAMPLES]

SCHEDULES: tuple[str, ...] = get_args(Schedule)
DROPOUT_PRNGS: tuple[str, ...] = get_args(DropoutPrng)
PARALLELISMS: tuple[str, ...] = get_args(Parallelism)

# Keys of configs written by earlier versions that no longer exist; dropped when read.
# model.max_len: the longest row is data.max_len (the model has no length limit of its own).
# train.loss_pass: the loss reads the logits through one float32 copy, its 'float32' pass.
REMOVED_KEYS = ('model.max_len', 'train.loss_pass')
# Values earlier versions accepted that an H200 refuted (docs/experiments.md, "Removed options"):
# (key, value) -> (what a stored one loads as, with one warning line; None: refused), and why.
REMOVED_VALUES = {
    ('train.loss_pass', 'accumulate'): (
        None,
        'no faster than the float32 loss on an H200; delete the key to use that one',
    ),
    ('model.attention_impl', 'cudnn_packed'): ('auto', 'its gradients were wrong on an H200'),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection(Section):
    """The pipeline's common keys. Each source declares and checks its own keys
    (``manual_dir``, ``folder``, ``synthetic``, ...: its ``KEYS``); they are kept in
    ``sources``, read-only, and read as attributes like the others (``data.manual_dir``,
    ``data.synthetic.num_train``)."""

    SECTION = 'data'
    dataset: str = field(
        'synthetic',
        doc="'synthetic', 'multi30k', 'folder' or a TFDS name ('wmt14_translate/de-en')",
    )
    source_lang: str = field('en', doc='translate from ... (language code: TFDS key, file suffix)')
    target_lang: str = field('de', doc='... to')
    # A multilingual vocabulary's codes (NLLB-200's 'eng_Latn'; transformer/data/language_pair.py).
    source_lang_code: str | None = field(
        None, optional=True, doc="a multilingual model's source code ('eng_Latn'): first in sources"
    )
    target_lang_code: str | None = field(
        None, optional=True, doc="its target code ('deu_Latn'): first in labels, forced in outputs"
    )
    train_split: str = field('train', doc='the split trained on')
    eval_split: str = field('validation', doc='validation split (newstest2013 for wmt14)')
    test_split: str = field('test', doc="evaluate's default split (newstest2014 for wmt14)")
    vocab_size: int = field(
        1000,
        AT_LEAST_4,
        MAX_VOCAB,
        doc='joint SentencePiece vocabulary of both languages (Sec. 5.1)',
    )
    vocab_model_type: VocabModelType = field(
        'bpe', optional=True, doc="SentencePiece model: 'bpe' | 'unigram' | 'word' | 'char'"
    )
    vocab_normalization: VocabNormalization = field(
        'nmt_nfkc',
        optional=True,
        doc="kept in the vocabulary: 'nmt_nfkc' keeps the case, 'nmt_nfkc_cf' lowercases",
    )
    pretokenize: Pretokenize = field(
        'none',
        optional=True,
        doc="'none' | 'moses': Moses punct-normalised, tokenized, escaped text (Multi30k's)",
    )
    vocab_sample_size: int = field(
        1_000_000, POSITIVE, doc='sentences (both languages) sampled to train SentencePiece'
    )
    vocab_path: str | None = field(None, optional=True, doc='None = WORKDIR/vocab')
    # The vocabulary's special ids (tokens.SpecialIds), recorded as a run is created or converted.
    pad_id: int = field(PAD_ID, NON_NEGATIVE, optional=True, doc="the vocabulary's padding id")
    eos_id: int = field(EOS_ID, NON_NEGATIVE, optional=True, doc='its end-of-sentence id')
    unk_id: int = field(UNK_ID, NON_NEGATIVE, optional=True, doc='its unknown-piece id')
    decoder_start_id: int = field(PAD_ID, NON_NEGATIVE, optional=True, doc='its decoder start')
    never_emit: str = field(str(PAD_ID), optional=True, doc='ids never output, comma-separated')
    max_len: int = field(64, AT_LEAST_2, doc='tokens per packed training row (both sides)')
    long_examples: LongExamples = field(
        'drop', optional=True, doc="training pairs over max_len: 'drop' or 'truncate' (keeps EOS)"
    )
    cache_dir: str | None = field(
        None, optional=True, doc='token-id cache; None = WORKDIR/data_cache (none without one)'
    )
    mix: str | None = field(
        None,
        optional=True,
        doc="train on 'NAME=SOURCE[:WEIGHT][:TAG][:PAIR],...'; None: on data.dataset",
    )
    mix_temperature: float = field(
        1.0, ABOVE_ZERO, optional=True, doc='data.mix weight left out: pairs ** (1 / T), normalised'
    )
    sources: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        try:  # the source's own keys and the splits, by the source that owns them; the mix
            data_sources.check(self)
            if self.mix:
                data_mix.parse(self.mix)
            data_lib.special_of(self)
        except DataError as e:
            raise ConfigError(str(e)) from None

    @property
    def special(self) -> SpecialIds:
        """The vocabulary's special ids this section records."""
        return data_lib.special_of(self)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: a source's own key.
        sources = self.__dict__.get('sources', {})
        if name in sources:
            return sources[name]
        raise AttributeError(f'data has no key {name!r}')


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptSection(Section):
    SECTION = 'opt'
    schedule: Schedule = field(
        'rsqrt',
        optional=True,
        doc="'rsqrt' (the paper's, Sec. 5.3) | 'inverse_sqrt' (fairseq's) | 'constant'",
    )
    warmup_steps: int = field(4000, POSITIVE, doc="steps of the schedule's linear warm-up")
    lr_scale: float = field(
        1.0,
        ABOVE_ZERO,
        doc="factor on the schedule (the lr itself for 'constant', the peak for 'inverse_sqrt')",
    )
    warmup_init_lr: float = field(
        0.0, NON_NEGATIVE, optional=True, doc="'inverse_sqrt' only: the lr of the first update"
    )
    cooldown_steps: int = field(
        0,
        NON_NEGATIVE,
        optional=True,
        doc='linear decay to 0 over the last N of train.num_steps; 0 = none',
    )
    b1: float = field(0.9, RATE, doc='Adam beta1 (Sec. 5.3)')
    b2: float = field(0.98, RATE, doc='Adam beta2')
    eps: float = field(1e-9, NON_NEGATIVE, doc='Adam epsilon')
    clip_grad_norm: float = field(
        0.0, NON_NEGATIVE, doc='global-norm clipping; 0 = off (the paper does not clip)'
    )
    # Decoupled weight decay (AdamW, Loshchilov & Hutter, 2019) on the weight matrices only:
    # biases and layer-norm scales are not decayed (transformer/training/optim.py says why).
    weight_decay: float = field(
        0.0,
        NON_NEGATIVE,
        optional=True,
        doc='AdamW: params -= lr x this x params on weight matrices, embedding too; 0 = Adam',
    )
    # Hugging Face's final_logits_bias is a buffer, never trained (transformer/training/optim.py).
    train_logits_bias: bool = field(
        False, optional=True, doc='train model.logits_bias; False keeps it fixed, as MarianMT does'
    )

    def __post_init__(self):
        super().__post_init__()
        if self.warmup_init_lr and self.schedule != 'inverse_sqrt':
            raise ConfigError(
                f'opt.warmup_init_lr={self.warmup_init_lr} is read by opt.schedule='
                f"'inverse_sqrt' only, not {self.schedule!r}: set it to 0 or change the schedule."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection(Section):
    SECTION = 'train'
    seed: int = field(
        0, NON_NEGATIVE, MAX_SEED, optional=True, doc='parameters, dropout and data order'
    )
    num_steps: int = field(
        100_000, POSITIVE, MAX_STEP, doc='Sec. 5.2: 100k steps for the base model'
    )
    batch_size: int = field(
        104, POSITIVE, doc='global packed rows per step (~25k target tokens, Sec. 5.1)'
    )
    grad_accum_steps: int = field(
        1, POSITIVE, doc='micro-batches per step, to reach the budget on fewer devices'
    )
    label_smoothing: float = field(0.1, RATE, doc='epsilon_ls (Sec. 5.4)')
    # Fine-tuning (transformer/training/init_from.py): the model and vocabulary come from there.
    init_from: str | None = field(
        None,
        optional=True,
        doc='fine-tune: a MarianMT or run directory (RUN@STEP: that step); None = random init',
    )
    # A pretrained model's recipe (multi30k.py:finetune): without a start it trains from scratch.
    init_from_required: bool = field(
        False, optional=True, doc='refuse to train without train.init_from (a fine-tuning recipe)'
    )
    add_tokens: str | None = field(
        None,
        optional=True,
        doc="with init_from a MarianMT: new tokens 'NAME[=LIKE],...' (docs/pretrained.md)",
    )
    # threefry (jax's default) measured cheapest on CPU (docs/experiments.md) and on an H200
    # (base, bfloat16: 40.8 ms/step, rbg 41.3); it is also what runs before the choice drew.
    dropout_prng: DropoutPrng = field(
        DROPOUT_PRNGS[0],
        optional=True,
        doc="dropout masks' PRNG ('rbg', 'unsafe_rbg': XLA's); each exact on resume",
    )
    parallelism: Parallelism = field(
        'sharding', doc="'sharding' (jit + NamedSharding) or 'pmap' (replicated)"
    )
    model_parallelism: int = field(
        1, POSITIVE, doc="size of the mesh's 'model' axis in 'sharding' mode"
    )
    fsdp: bool = field(
        False, optional=True, doc="also shard parameters + Adam moments over 'data' (ZeRO-3 style)"
    )
    prefetch: int = field(
        2,
        NON_NEGATIVE,
        optional=True,
        doc='batches packed and placed ahead on a background thread (0 = off)',
    )
    log_every: int = field(100, POSITIVE, doc='steps between console / metrics lines')
    eval_every: int = field(
        2000, NON_NEGATIVE, doc='steps between validation loss (0 = only at the end)'
    )
    checkpoint_every: int = field(
        1500,
        POSITIVE,
        doc='the paper writes one every 10 minutes (Sec. 6.1): 1500 steps at 0.4 s/step',
    )
    keep_checkpoints: int = field(5, POSITIVE, doc='kept on disk; >= eval.average_last')
    async_checkpointing: bool = field(
        True, optional=True, doc='write checkpoints while training continues'
    )
    distributed: bool = field(
        False, optional=True, doc='join a multi-process run (jax.distributed.initialize)'
    )
    coordinator_address: str | None = field(
        None, optional=True, doc="e.g. 'localhost:12355'; None = the cluster's auto-detection"
    )
    num_processes: int | None = field(
        None, POSITIVE, optional=True, doc="None = the cluster's auto-detection"
    )
    process_id: int | None = field(
        None, NON_NEGATIVE, optional=True, doc="None = the cluster's auto-detection"
    )
    init_timeout_s: int = field(
        60,
        POSITIVE,
        MAX_INIT_TIMEOUT,
        optional=True,
        doc='a process that cannot reach the coordinator stops after this many seconds',
    )
    early_stop_patience: int = field(
        0,
        NON_NEGATIVE,
        optional=True,
        doc='stop after N validation BLEUs without a new best (0 = off); WORKDIR/best kept',
    )
    loss_chunk_tokens: int = field(
        0,
        NON_NEGATIVE,
        optional=True,
        doc='>0: the loss in chunks of N tokens, no [B, T, V] logits',
    )
    # R-Drop (Liang et al., 2021): two passes with independent dropout masks, their mean
    # cross-entropy + alpha x their symmetric KL (transformer/training/steps.py).
    rdrop_alpha: float = field(
        0.0,
        NON_NEGATIVE,
        optional=True,
        doc="R-Drop: weight of the two dropout passes' symmetric KL (0 = off; 2 passes a step)",
    )

    # The z-loss (PaLM, Chowdhery et al., 2022): C log(Z)^2 per target token, Z the softmax's
    # normaliser; reported as z_loss beside the loss (transformer/training/loss.py).
    z_loss: float = field(
        0.0,
        NON_NEGATIVE,
        optional=True,
        doc='z-loss C: C log(Z)^2 added per target token (PaLM: 1e-4; 0 = off)',
    )

    def __post_init__(self):
        super().__post_init__()
        try:
            data_lib.added_tokens.parse(self.add_tokens)
        except DataError as e:
            raise ConfigError(str(e)) from None
        if self.add_tokens and not self.init_from:
            raise ConfigError(
                f'train.add_tokens={self.add_tokens!r} adds tokens to the vocabulary that '
                'train.init_from gives: set train.init_from (a new vocabulary gets its tags '
                'from data.mix).'
            )
        if self.rdrop_alpha and self.loss_chunk_tokens:
            raise ConfigError(
                f'train.rdrop_alpha={self.rdrop_alpha} needs the logits of both passes, which '
                f'train.loss_chunk_tokens={self.loss_chunk_tokens} never forms: set one to 0.'
            )


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A whole config, typed; the rules between sections are checked here."""

    model: TransformerConfig
    data: DataSection
    opt: OptSection
    train: TrainSection
    eval: EvalSection

    def __post_init__(self):
        o, t, e, d, m = self.opt, self.train, self.eval, self.data, self.model
        for wrong, problem in (
            (o.cooldown_steps > t.num_steps,
             f'opt.cooldown_steps={o.cooldown_steps} exceeds train.num_steps={t.num_steps}.'),
            (e.beam_size > d.vocab_size,
             f'eval.beam_size={e.beam_size} exceeds data.vocab_size={d.vocab_size}: a beam '
             'cannot hold more hypotheses than the first step has words.'),
            (m.max_positions is not None and d.max_len > m.max_positions,  # a learned table
             f'data.max_len={d.max_len} exceeds model.max_positions={m.max_positions}: the '
             'learned position table has no row past it; lower data.max_len.'),
        ):  # fmt: skip
            if wrong:
                raise ConfigError(problem)


SECTIONS = {'data': DataSection, 'opt': OptSection, 'train': TrainSection, 'eval': EvalSection}
