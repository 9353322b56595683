"""The paper's network in pure Flax. Callers import its public API: ``from transformer.model import
Transformer, TransformerConfig``, and call the network only through its functions
(functional.py: parameters, their logical specs and shardings, logits, hidden states and the
output projection, encode, the decoding cache and one step, attention maps); no module outside
this package imports flax.linen (tests/test_layout.py).

Modules: attention.py (multi-head attention, an einsum over an explicit head axis),
projections.py (its [D, N, H] / [N, H, D] parameters; the kernel's two views `per_head` and
`fused`), dot_product.py (scaled dot-product attention, the one `attend` of every path: its
scale and logits bias), decode_attention.py (a decoding step's attention over the cache),
positions.py (how positions enter: the sinusoids, rotary positions, learned tables),
relative_positions.py (T5's relative position buckets, a bias on self-attention's logits),
layers.py (the encoder and decoder layers, the shifted decoder inputs, the masks' making),
layer_stack.py (the layers' two layouts, unrolled and scanned, and the conversion between
them), transformer.py (the Transformer), output_head.py (its pre-softmax projection, the one
rule of the logits from the hidden states, which the forward pass and the chunked loss both
follow: `output_logits`),
config.py (its config), cache.py (the decoder's key/value cache layout, shared across beams),
masks.py (attention masks, packed rows' included, kept as their parts), dropout.py (16-bit
dropout masks), embedding.py (the embedding lookup and its gradient variants), attention_maps.py
(every head's attention probabilities of one example), flops.py (analytic FLOPs and the device's
peak), variants.py (the registry of what the network may compute: each variant's weights and
module), settings.py (the numeric settings), feed_forward.py (the feed-forward variants),
norms.py (the normalizations), remat.py (what each layer keeps for the backward pass, and the
CPU compiler's options for it), functional.py (the functions above).
"""

from transformer.model.attention_maps import KINDS as ATTENTION_MAP_KINDS
from transformer.model.attention_maps import attention_maps
from transformer.model.cache import beam_mask, padded_length, share_across_beams
from transformer.model.config import (
    DTYPE_FIELDS,
    HOW_FIELDS,
    VOCABULARY_FIELDS,
    TransformerConfig,
    config_from_dict,
)
from transformer.model.embedding import EMBEDDING_GRADS
from transformer.model.embedding import lookup as embedding_lookup
from transformer.model.feed_forward import FeedForward
from transformer.model.flops import peak_flops, train_flops
from transformer.model.functional import (
    abstract_params,
    decode_step,
    encode,
    hidden_and_projection,
    in_activation_layout,
    init_cache,
    init_params,
    logical_partition_specs,
    logical_shardings,
    teacher_forced_logits,
)
from transformer.model.layer_stack import STACKED_KEYS
from transformer.model.layer_stack import convert as convert_layer_layout
from transformer.model.layer_stack import stack as stack_layers
from transformer.model.layer_stack import unstack as unstack_layers
from transformer.model.layers import attention_mask, shift_right
from transformer.model.norms import layer_norm
from transformer.model.output_head import logits as output_logits
from transformer.model.packing import Packing
from transformer.model.positions import fairseq_sinusoids, sinusoidal_positions
from transformer.model.projections import fused, per_head
from transformer.model.relative_positions import relative_position_buckets
from transformer.model.remat import compiler_options as remat_compiler_options
from transformer.model.settings import Setting, peer_refusal
from transformer.model.transformer import Transformer
from transformer.model.variants import (
    Variant,
    describe,
    export_refusal,
    layer_param_count,
    model_fields,
    param_count,
    param_shapes,
)
from transformer.tokens import EOS_ID, PAD_ID  # the joint vocabulary's (tokens.JOINT)

__all__ = [
    'ATTENTION_MAP_KINDS',
    'DTYPE_FIELDS',
    'EMBEDDING_GRADS',
    'EOS_ID',
    'FeedForward',
    'HOW_FIELDS',
    'VOCABULARY_FIELDS',
    'PAD_ID',
    'Packing',
    'STACKED_KEYS',
    'Setting',
    'Transformer',
    'TransformerConfig',
    'Variant',
    'abstract_params',
    'attention_mask',
    'attention_maps',
    'beam_mask',
    'config_from_dict',
    'convert_layer_layout',
    'decode_step',
    'describe',
    'embedding_lookup',
    'encode',
    'export_refusal',
    'fused',
    'hidden_and_projection',
    'in_activation_layout',
    'init_cache',
    'init_params',
    'layer_norm',
    'layer_param_count',
    'model_fields',
    'output_logits',
    'logical_partition_specs',
    'logical_shardings',
    'padded_length',
    'param_count',
    'param_shapes',
    'peak_flops',
    'peer_refusal',
    'per_head',
    'relative_position_buckets',
    'remat_compiler_options',
    'settings',
    'share_across_beams',
    'shift_right',
    'fairseq_sinusoids',
    'sinusoidal_positions',
    'stack_layers',
    'teacher_forced_logits',
    'train_flops',
    'unstack_layers',
    'variants',
]
