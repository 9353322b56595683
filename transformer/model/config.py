"""The model's hyper-parameters: `TransformerConfig`, and its making from a config file's
``model`` section. Kept apart from transformer/model/transformer.py so that the layers can name the
config without importing the network built from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

from transformer.fields import (
    ABOVE_ZERO,
    BOOL,
    POSITIVE,
    RATE,
    ConfigError,
    Section,
    check_keys,
    field,
)
from transformer.model import settings, variants
from transformer.model.attention import ATTENTION_IMPLS
from transformer.model.embedding import EMBEDDING_GRADS
from transformer.model.remat import REMAT_POLICIES
from transformer.tokens import JOINT, SpecialIds

# The fields that choose how, not what, the model computes (the same function either way): a
# resume may change them (run_changes.RESUME_FREE), and the config of a conversion
# (transformer/commands/convert.py) or of a fine-tuning (transformer/training/init_from.py)
# may set them.
HOW_FIELDS = ('attention_impl', 'embedding_grad', 'remat', 'scan_layers')
# The fields the vocabulary sets, not the model section: its size and its special ids, which
# config.json records in the data section (data.vocab_size, data.pad_id ... data.never_emit).
VOCABULARY_FIELDS = ('vocab_size', 'special')
# The dtypes: a new run from a given model (a conversion, a fine-tuning) may choose them; a
# resume may not (its checkpoints hold the parameters in param_dtype, its numbers followed dtype).
DTYPE_FIELDS = ('dtype', 'param_dtype')


def _field(default: Any, doc: str, rule: dict[str, Any] | None = None) -> Any:
    # Every model field may be left out of a config (config.json of an earlier run).
    return field(default, rule, doc=doc, optional=True)


@dataclasses.dataclass(frozen=True)
class TransformerConfig(Section):
    """Hyper-parameters of the model: the config's ``model`` section (transformer/schema/).
    Each default, written only here, is the paper's base model (Table 3). A run's config.json
    written before a field existed gets its default: each such field's default is the value
    those runs used, but for attention_impl and embedding_grad, which choose how, not what,
    is computed (`HOW_FIELDS`). Each field is checked against its type and rule as the
    schema's sections are (`transformer.fields.Section`); the rule between fields is
    `__post_init__`'s."""

    SECTION = 'model'
    vocab_size: int = dataclasses.field(metadata={**POSITIVE, 'doc': 'the joint vocabulary'})
    d_model: int = _field(
        512, "D (Table 3, base): the width of every layer's input and output", POSITIVE
    )
    num_heads: int = _field(8, 'N, attention heads per layer', POSITIVE)
    # Numeric settings declared in transformer/model/settings.py: default, rule, description,
    # the shapes they set and what the exports and the PyTorch peer take.
    head_dim: int | None = settings.config_field('head_dim')
    num_kv_heads: int | None = settings.config_field('num_kv_heads')
    attention_bias: bool = settings.config_field('attention_bias')
    qk_norm: bool = settings.config_field('qk_norm')
    attention_scale: float | None = settings.config_field('attention_scale')
    d_ff: int = _field(2048, 'F, inner FFN width', POSITIVE)
    # The feed-forward's variant (transformer/model/feed_forward.py). Each field read by
    # variants.config_field chooses a part of model/variants.py: its default, description and
    # accepted values (the entries registered for it) are the registry's.
    ffn: str = variants.config_field('ffn')
    num_encoder_layers: int = _field(6, 'encoder layers (Sec. 3.1)', POSITIVE)
    num_decoder_layers: int = _field(6, 'decoder layers (Sec. 3.1)', POSITIVE)
    dropout_rate: float = _field(
        0.1, 'P_drop on sub-layer outputs and embedding sums (Sec. 5.4)', RATE
    )
    attention_dropout_rate: float = _field(
        0.0, 'on attention probabilities (not in the paper)', RATE
    )
    # The key keeps its first name (config.json of earlier runs): it drops out the hidden layer
    # of whichever feed-forward model.ffn chooses.
    relu_dropout_rate: float = _field(
        0.0, "on the FFN's hidden layer, after its activation (not in the paper)", RATE
    )
    # Word dropout (Sennrich, Haddow & Birch, 2016, "Edinburgh Neural Machine Translation
    # Systems for WMT 16"; Gal & Ghahramani, 2016): whole source and decoder-input tokens'
    # embeddings dropped in training (transformer/model/transformer.py `_embed`).
    token_dropout_rate: float = _field(
        0.0, "whole tokens' embeddings dropped, source and target side (not in the paper)", RATE
    )
    # Accepted from Python callers and ignored: the network has no length limit (sinusoidal
    # positions, caches sized by the caller); the longest training row is the data's max_len.
    # A config file's model.max_len is dropped when it is read (schema.REMOVED_KEYS).
    max_len: dataclasses.InitVar[int | None] = None
    # 'all': source, target and pre-softmax share one matrix (joint vocabulary, Sec. 3.4);
    # 'target': target embedding == pre-softmax projection, separate source embedding;
    # 'none': three separate matrices.
    share_embeddings: str = variants.config_field('embeddings')
    # A bias [V] on the logits (MarianMT's final_logits_bias), fixed unless
    # opt.train_logits_bias (transformer/training/optim.py).
    logits_bias: bool = variants.config_field('logits_bias')
    # A tied head's input times d_model^-0.5 (T5 v1.0; transformer/model/output_head.py).
    rescale_tied_head: bool = settings.config_field('rescale_tied_head')
    # The kind of normalization around each sub-layer (transformer/model/norms.py) and where
    # it sits: post-LN (the paper) or pre-LN (tensor2tensor's later default).
    norm: str = variants.config_field('norm')
    pre_layer_norm: bool = variants.config_field('norm_placement')
    # A norm of model.norm's kind on each stack's embedding sum, before its dropout (mBART's).
    layernorm_embedding: bool = variants.config_field('embedding_norm')
    # How positions enter (transformer/model/positions.py): the paper's sinusoids added to the
    # embeddings, rotary positions in self-attention, or T5's bias on the attention logits.
    positions: str = variants.config_field('positions')
    # The rows of a learned position table (model.positions='bart_learned'); None: no table.
    max_positions: int | None = settings.config_field('max_positions')
    # T5's relative position buckets (model.positions='t5_relative'): how many, and the
    # distance from which they are all one.
    relative_attention_num_buckets: int = settings.config_field('relative_attention_num_buckets')
    relative_attention_max_distance: int = settings.config_field('relative_attention_max_distance')
    # Embeddings multiplied by sqrt(d_model) (Sec. 3.4), or not (fairseq's scale_embedding).
    scale_embedding: bool = settings.config_field('scale_embedding')
    layer_norm_epsilon: float = _field(
        1e-6, 'added to the variance in layer normalization', ABOVE_ZERO
    )
    # 'einsum': explicit logits + masked softmax (sows attention weights, for visualize);
    # 'fused': jax.nn.dot_product_attention (cuDNN flash attention on NVIDIA GPUs);
    # 'pallas': 'fused', with packed self-attention by Pallas's segment-id kernel on a GPU;
    # 'auto': the measured winner of the backend (backends/platform.py).
    attention_impl: Literal[ATTENTION_IMPLS] = _field(
        'auto',
        "'auto': cuDNN's fused attention on a GPU, 'einsum' elsewhere; 'fused', 'pallas'",
    )
    # The embedding table's gradient (transformer/model/embedding.py): 'scatter' (autodiff's
    # scatter-add), 'one_hot' (blocked one-hot products), 'sorted_scatter' (a segment sum over
    # sorted tokens); 'auto': the measured winner for the backend (backends/platform.py).
    embedding_grad: Literal[EMBEDDING_GRADS] = _field(
        'auto', "the embedding's gradient: 'scatter', 'one_hot', ... (measured)"
    )
    # What each layer keeps for the backward pass (transformer/model/remat.py): 'none' keeps
    # everything; 'full' recomputes the layer; 'dots' keeps the matrix products' outputs;
    # 'attention' keeps the attention's output. The same function either way.
    remat: Literal[REMAT_POLICIES] = _field(
        'none', "recomputed in the backward pass: 'none', 'full', 'dots', 'attention'"
    )
    # The layers as one nn.scan over parameters stacked on a leading layer axis
    # (transformer/model/layer_stack.py): one layer's program for every layer, so the compile
    # time does not grow with depth. How, not what: a resume may change it.
    scan_layers: bool = _field(False, 'the layers as one scan over stacked parameters', BOOL)
    dtype: Any = _field(
        jnp.float32, "computation dtype; 'bfloat16' on GPU/TPU and AVX512-BF16 CPUs"
    )
    param_dtype: Any = _field(jnp.float32, 'dtype the parameters are stored and updated in')
    # Padding (masked), the decoder's start (the shifted-right target's first input, Sec. 3.1)
    # and the ids the searches end on and never emit: the vocabulary's (transformer/tokens.py).
    special: SpecialIds = dataclasses.field(
        default=JOINT, metadata={'doc': "the vocabulary's special ids", 'optional': True}
    )

    def __post_init__(self, max_len: int | None):
        del max_len
        super().__post_init__()
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ConfigError(
                f'model.d_model={self.d_model} must be a multiple of model.num_heads='
                f'{self.num_heads} (or set model.head_dim).'
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f'model.num_kv_heads={self.num_kv_heads} must divide model.num_heads='
                f'{self.num_heads}: each key/value head serves N / K query heads.'
            )
        if self.rescale_tied_head and self.share_embeddings in ('none', 'inputs'):
            raise ConfigError(
                f"model.rescale_tied_head rescales a tied head's input, and "
                f'model.share_embeddings={self.share_embeddings!r} unties it: set it False.'
            )
        if self.special.largest() >= self.vocab_size:
            raise ConfigError(
                f'The special ids {self.special} must be ids of the vocabulary of '
                f'{self.vocab_size}: set data.pad_id ... data.never_emit below its size.'
            )
        problem = variants.check(self)  # what a chosen entry needs of the other fields
        if problem:
            raise ConfigError(problem)


# Computation and parameter dtypes a config may name.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


def config_from_dict(
    model: Mapping[str, Any] | TransformerConfig,
    vocab_size: int,
    special: SpecialIds | None = None,
) -> TransformerConfig:
    """A TransformerConfig from a config file's ``model`` section (one key per field), or a
    TransformerConfig (the typed section, transformer/schema/) with this vocabulary: its size
    and its special ids (None: a TransformerConfig's own, a section's `JOINT`).

    ``dtype`` / ``param_dtype`` may be given by name ('float32', 'bfloat16'); unknown keys fail
    with the nearest valid one.
    """
    if isinstance(model, TransformerConfig):
        return dataclasses.replace(model, vocab_size=vocab_size, special=special or model.special)
    kwargs = dict(model)
    fields = [
        f.name for f in dataclasses.fields(TransformerConfig) if f.name not in VOCABULARY_FIELDS
    ]
    check_keys('model', kwargs, fields)
    for key in ('dtype', 'param_dtype'):
        if isinstance(kwargs.get(key), str):
            if kwargs[key] not in DTYPES:
                raise ConfigError(
                    f'model.{key}={kwargs[key]!r} must be one of ' + ', '.join(map(repr, DTYPES))
                )
            kwargs[key] = DTYPES[kwargs[key]]
    return TransformerConfig(vocab_size=vocab_size, special=special or JOINT, **kwargs)
