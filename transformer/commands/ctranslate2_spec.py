"""The CTranslate2 export, written directly: our parameter tree as CTranslate2's
``TransformerSpec`` (ctranslate2.specs), with no Hugging Face files in between.

The exporting process computes everything in numpy: the spec's constructor options
(`spec_options`), its variables by their names in the spec (`spec_weights`:
'encoder/layer_0/self_attention/linear_0/weight' -> array) and its config and vocabulary. It
writes them into the staging directory and a Python process of its own (`save_model`) imports
ctranslate2, builds the spec, assigns the arrays, validates, optionally quantizes and saves
(`write_ctranslate2`). The exporting process already runs jax's thread pools; a test process
that also held torch and CTranslate2's OpenMP runtime was lost without a traceback now and
then, so it never imports ctranslate2, and this module imports neither jax nor ctranslate2 at
its top (the child imports it).

The mapping is a relabelling, not an approximation: CTranslate2's encoder-decoder Transformer
has each option our model has.

* Norms: post-LN (``pre_norm=False``: Norm(x + Sublayer(x)), no final norms) or pre-LN with
  the final ``encoder_norm`` / ``decoder_norm``; LayerNorm (gamma, beta) or RMSNorm
  (``rms_norm=True``, gamma only); one epsilon, ``model.layer_norm_epsilon``, in the config.
* Attention: CTranslate2's self-attention fuses q, k, v into one [N*H + 2*K*H, D] matrix
  (``linear_0``; torch layout [out, in], a head's H rows together: our kernel
  ``reshape(D, -1).T``), its cross-attention has q (``linear_0``) and the fused k, v
  (``linear_1``); the output projection is the last linear. ``num_heads_kv`` and ``head_dim``
  are spec options; QK-norm is ``qk_norm`` (an RMSNorm over each head's H channels; with one
  head only: its cross-attention norms all heads' queries together, so `WRITES` refuses it
  with more).
* Feed-forward: ``linear_0`` (activated), ``linear_1``; the gated ones add ``linear_0_noact``,
  the linear branch (``ffn_glu=True``).
* Positions (row p of a table: what our model adds at p), the embedding scale and mBART's
  ``layernorm_embedding``: ctranslate2_embeddings.py. Rotary positions: ``rotary_dim=0``
  (every channel), ``rotary_interleave=False`` (pairs (j, j + H/2)), base 10000, no table;
  T5's relative buckets, unscaled logits and tied-head rescale: ctranslate2_t5.py.
* Embeddings: the target table or ``logits_dense`` is the decoder's ``projection``,
  ``model.logits_bias`` (mBART's final_logits_bias) its bias. The decoder starts from the
  embedding of the vocabulary's start token (the joint vocabulary's <pad>, id 0; fairseq's
  </s>), its ``decoder_start_token``. The vocabulary is written in our id order
  (``tokenizer.id_to_piece``), a pretrained family's too (codes included), so no row moves;
  its SentencePiece files are the family's (`interop.Family.tokenizer_files`). A source
  holds its language code (``[src_code] X </s>``), the target's is the ``target_prefix``.

What the spec holds of a model is declared once, `WRITES` (transformer/formats.py): the values
of each field mapped above; any other is refused in one line before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from transformer.commands import ctranslate2_t5
from transformer.commands.ctranslate2_embeddings import stack_inputs
from transformer.formats import EVERY_VALUE, ExportError, Format, Writes, max_length

SPM_FILES = ('source.spm', 'target.spm')
WEIGHTS, REQUEST = 'ctranslate2_weights.npz', 'ctranslate2_request.json'
# common_spec.Activation of each model.ffn (model/feed_forward.py; a gated one's gate); GELU: erf's.
ACTIVATIONS = {'relu': 'RELU', 'swish': 'SWISH', 'gelu': 'GELU', 'swiglu': 'SWISH', 'geglu': 'GELU'}
ACTIVATIONS['geglu_tanh'] = 'GELUTanh'  # T5 v1.1's gated-gelu (ctranslate2_t5.py)
GATED = ('swiglu', 'geglu', 'geglu_tanh')
POSITIONS = ('sinusoidal', 'rope', 'fairseq_sinusoidal', 'bart_learned', ctranslate2_t5.POSITIONS)
ROTARY_BASE = 10000.0  # transformer/model/positions.py BASE


def _qk_norm(cfg: Any) -> str | None:
    """CTranslate2 (4.8) norms each head's queries and keys in self-attention, but in
    cross-attention the queries of all heads together, one RMSNorm over N * H channels
    (src/layers/attention.cc, process_cross_attention; tests/test_export_ctranslate2.py
    measures it): the same as ours with one head only."""
    if not cfg.qk_norm or cfg.num_heads == 1:
        return None
    return (
        f'with model.num_heads={cfg.num_heads}, CTranslate2 norms the cross-attention queries '
        'of all heads together, not head by head; only qk_norm=False (or num_heads=1) exports.'
    )


# What the spec holds of a model (transformer/formats.py): the values of each variant field
# (transformer/model/variants.py) and numeric setting (transformer/model/settings.py) that
# `spec_options` and `spec_weights` map. Any other value is refused.
WRITES = Format(
    'ctranslate2',
    'CTranslate2',
    {
        'ffn': Writes(tuple(ACTIVATIONS)),
        'norm': Writes(('layer_norm', 'rms_norm')),  # rms_norm=True: gamma alone
        'pre_layer_norm': Writes((False, True)),
        'share_embeddings': Writes(('all', 'target', 'none', 'inputs')),
        'logits_bias': Writes((False, True)),
        'positions': Writes(POSITIONS),
        'max_positions': EVERY_VALUE,  # a learned table's rows
        'layernorm_embedding': Writes((False, True)),
        'scale_embedding': Writes((True, False)),
        'head_dim': EVERY_VALUE,
        'num_kv_heads': EVERY_VALUE,
        'attention_bias': Writes((False, True)),
        'qk_norm': Writes(check=_qk_norm),
        **ctranslate2_t5.FIELDS,  # attention_scale; T5's buckets and head rescale
    },
)


def _dims(cfg: Any) -> tuple[int, int, int]:
    """(N, K, H): query heads, key/value heads, head size (transformer/model/settings.py)."""
    head_dim = cfg.head_dim or cfg.d_model // cfg.num_heads
    return cfg.num_heads, cfg.num_kv_heads or cfg.num_heads, head_dim


def spec_options(cfg: Any) -> dict[str, dict[str, Any]]:
    """The keyword arguments of ctranslate2.specs' TransformerEncoderSpec ('encoder') and
    TransformerDecoderSpec ('decoder') for ``cfg`` (a TransformerConfig), JSON-able: the
    activation by its ``common_spec.Activation`` name."""
    num_heads, num_kv_heads, head_dim = _dims(cfg)
    rope = cfg.positions == 'rope'
    common = {
        'num_heads': num_heads,
        'pre_norm': bool(cfg.pre_layer_norm),
        'activation': ACTIVATIONS[cfg.ffn],
        'ffn_glu': cfg.ffn in GATED,
        'rms_norm': cfg.norm == 'rms_norm',
        'num_heads_kv': None if num_kv_heads == num_heads else num_kv_heads,
        'head_dim': None if head_dim * num_heads == cfg.d_model else head_dim,
        'qk_norm': cfg.qk_norm,
        'layernorm_embedding': cfg.layernorm_embedding,
        # rotary_dim=None: no rotation; 0: every channel of each head.
        'rotary_dim': 0 if rope else None,
        'rotary_interleave': False,
        'rotary_base': ROTARY_BASE,
        **ctranslate2_t5.options(cfg),
    }
    return {
        'encoder': {'num_layers': cfg.num_encoder_layers, **common},
        'decoder': {'num_layers': cfg.num_decoder_layers, **common},
    }


def _f32(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32))


def _attention(p: dict[str, Any], d_model: int, self_attention: bool) -> dict[str, np.ndarray]:
    """One attention's variables below its scope: the linears (torch layout [out, in]) and
    QK-norm's scales."""

    def rows(name: str) -> np.ndarray:  # [D, N, H] -> [N*H, D]
        return np.asarray(p[name]['kernel']).reshape(d_model, -1).T

    def bias(name: str) -> np.ndarray | None:
        return np.reshape(p[name]['bias'], -1) if 'bias' in p[name] else None

    groups = [('query', 'key', 'value')] if self_attention else [('query',), ('key', 'value')]
    out = {}
    for i, names in enumerate(groups):
        out[f'linear_{i}/weight'] = _f32(np.concatenate([rows(n) for n in names]))
        biases = [bias(n) for n in names]
        if biases[0] is not None:
            out[f'linear_{i}/bias'] = _f32(np.concatenate(biases))
    last = f'linear_{len(groups)}'
    out[f'{last}/weight'] = _f32(np.asarray(p['out']['kernel']).reshape(-1, d_model).T)
    if 'bias' in p['out']:
        out[f'{last}/bias'] = _f32(p['out']['bias'])
    for ours, theirs in (('query_norm', 'q_norm'), ('key_norm', 'k_norm')):
        if ours in p:
            out[f'{theirs}/gamma'] = _f32(p[ours]['scale'])
    return out


def _norm(p: dict[str, Any]) -> dict[str, np.ndarray]:
    """A LayerNorm (gamma, beta) or an RMSNorm (gamma alone)."""
    out = {'gamma': _f32(p['scale'])}
    if 'bias' in p:
        out['beta'] = _f32(p['bias'])
    return out


def _ffn(p: dict[str, Any]) -> dict[str, np.ndarray]:
    """The feed-forward's linears: wi (or the gate wi_0, and wi_1 unactivated), wo."""
    names = {'linear_1': 'wo'}
    names |= {'linear_0': 'wi_0', 'linear_0_noact': 'wi_1'} if 'wi_0' in p else {'linear_0': 'wi'}
    out = {}
    for theirs, ours in names.items():
        out[f'{theirs}/weight'] = _f32(np.asarray(p[ours]['kernel']).T)
        if 'bias' in p[ours]:
            out[f'{theirs}/bias'] = _f32(p[ours]['bias'])
    return out


def _scoped(scope: str, variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f'{scope}/{name}': value for name, value in variables.items()}


def _layers(params: Any, cfg: Any) -> dict[str, np.ndarray]:
    """Every encoder and decoder layer's variables, by their names in the spec."""
    out = {}
    sublayers = {
        'encoder': {'self_attention': 'self_attention'},
        'decoder': {'self_attention': 'self_attention', 'cross_attention': 'attention'},
    }
    for stack, attentions in sublayers.items():
        for i in range(getattr(cfg, f'num_{stack}_layers')):
            p, scope = params[f'{stack}_layer_{i}'], f'{stack}/layer_{i}'
            for ours, theirs in attentions.items():
                self_attention = ours == 'self_attention'
                out |= _scoped(
                    f'{scope}/{theirs}', _attention(p[ours], cfg.d_model, self_attention)
                )
                out |= _scoped(f'{scope}/{theirs}/layer_norm', _norm(p[f'{ours}_norm']))
            out |= _scoped(f'{scope}/ffn', _ffn(p['ffn']))
            out |= _scoped(f'{scope}/ffn/layer_norm', _norm(p['ffn_norm']))
    return out


def spec_weights(params: Any, cfg: Any, max_positions: int) -> dict[str, np.ndarray]:
    """Our parameter tree -> the TransformerSpec's variables by name, float32 numpy.

    Args:
      params: the model's parameters (plain nested dicts of arrays).
      cfg: its TransformerConfig (one `spec_options` is made of).
      max_positions: the rows of a computed position table (the longest input CTranslate2
        may read or write); unused with a learned table or rotary positions.
    """
    out = _layers(params, cfg)
    if 'shared_embedding' in params:
        source = target = params['shared_embedding']['embedding']
    else:
        source = params['source_embedding']['embedding']
        target = params['target_embedding']['embedding']
    out['encoder/embeddings_0/weight'] = _f32(source)
    out['decoder/embeddings/weight'] = _f32(target)
    # The pre-softmax matrix [V, D] (Sec. 3.4): the target table, or logits_dense's kernel.
    projection = params['logits_dense']['kernel'].T if 'logits_dense' in params else target
    out['decoder/projection/weight'] = _f32(projection)
    if 'logits_bias' in params:
        out['decoder/projection/bias'] = _f32(params['logits_bias'])
    if cfg.pre_layer_norm:
        out |= _scoped('encoder/layer_norm', _norm(params['encoder_norm']))
        out |= _scoped('decoder/layer_norm', _norm(params['decoder_norm']))
    return out | stack_inputs(params, cfg, max_positions) | ctranslate2_t5.weights(params, cfg)


def vocabulary_and_tokens(tokenizer: Any) -> tuple[list[str], dict[str, str]]:
    """The pieces in our id order (a pretrained vocabulary's too: no row moves) and the
    config's special tokens, the vocabulary's (``tokenizer.special``): the decoder starts from
    its start token (<pad>, id 0, for the joint vocabulary; fairseq's </s>), as ours does;
    sources get no BOS (``add_source_bos`` is off): the vocabulary's <s>, else <pad>."""
    if getattr(tokenizer, 'separate', False):
        raise ValueError(
            'separate source and target vocabularies (separate_vocabs): this CTranslate2 '
            'export writes one vocabulary for both sides; export with --format hf.'
        )
    pieces = ctranslate2_t5.named_rows(
        [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    )
    if len(set(pieces)) != len(pieces):
        raise ValueError('the vocabulary has duplicate pieces; CTranslate2 needs unique ones.')
    special = tokenizer.special
    tokens = {
        'unk_token': tokenizer.id_to_piece(special.unk),
        'eos_token': tokenizer.id_to_piece(special.eos),
        'bos_token': tokenizer.id_to_piece(special.pad),
        'decoder_start_token': tokenizer.id_to_piece(special.decoder_start),
    }
    if tokenizer.token_id('<s>') is not None:  # fairseq's, as CTranslate2's converter has it
        tokens['bos_token'] = '<s>'
    return pieces, tokens


def spm_files(tokenizer: Any) -> dict[str, str]:
    """source.spm and target.spm for the model directory: our joint SentencePiece model under
    both names, or a pretrained family's own (`interop.Family.tokenizer_files`)."""
    from transformer import interop  # jax: not the child's

    family = interop.vocabulary_family(tokenizer)
    if family is not None:
        return family.tokenizer_files(tokenizer)
    return {name: tokenizer.model_path for name in SPM_FILES}


def write_ctranslate2(
    staging: str,
    cfg: Any,
    run_config: Any,
    tokenizer: Any,
    params: Any,
    *,
    quantization: str | None = None,
) -> str:
    """Writes the CTranslate2 model directory ``staging``/ctranslate2 (model.bin, config.json,
    the vocabulary, source.spm, target.spm) and returns its path.

    Args:
      staging: an existing directory for the arrays, the request and the model.
      cfg: the model's configuration (`export.check_expressible` has passed its run).
      run_config: the run's config (``data.max_len``, ``eval.extra_length`` are read).
      tokenizer: the run's vocabulary.
      params: the parameters to export.
      quantization: None (float32) or 'int8'.

    Raises:
      ExportError: the vocabulary or the child process failed; one line.
    """
    from transformer.model import export_refusal  # jax: not the child's

    # What the mapping has no names for, and what CTranslate2 computes otherwise.
    refusal = export_refusal(cfg, WRITES)
    if refusal:
        raise ExportError(refusal)
    try:
        pieces, tokens = vocabulary_and_tokens(tokenizer)
    except ValueError as e:
        raise ExportError(f'{getattr(tokenizer, "model_path", tokenizer)}: {e}') from None
    # CTranslate2 stores a computed position table and fails past its end: the longest input
    # of training + the paper's +50, and at least its default 1024 input tokens.
    rows = max(max_length(run_config.eval, run_config.data.max_len), 1024)
    np.savez(os.path.join(staging, WEIGHTS), **spec_weights(params, cfg, rows))
    directory = os.path.join(staging, 'ctranslate2')
    request = {
        'directory': directory,
        'weights': os.path.join(staging, WEIGHTS),
        'spec': spec_options(cfg),
        'config': {'layer_norm_epsilon': cfg.layer_norm_epsilon, **tokens},
        'vocabulary': pieces,
        'files': spm_files(tokenizer),
        'quantization': quantization,
    }
    with open(os.path.join(staging, REQUEST), 'w', encoding='utf-8') as f:
        json.dump(request, f, ensure_ascii=False)
    _run_child(os.path.join(staging, REQUEST), ExportError)
    return directory


def _run_child(request_path: str, error: type[Exception]) -> None:
    """`save_model` in a Python process of its own; ``error`` (one line: the child's last
    line of stderr) if it fails."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = [package_root, *filter(None, os.environ.get('PYTHONPATH', '').split(os.pathsep))]
    # ctranslate2.specs imports torch when it can (most of the child's time for a small
    # model), for bfloat16 and torch tensors only; the arrays here are numpy, float32 or int8.
    code = (
        'import sys\n'
        "sys.modules['torch'] = None\n"
        'from transformer.commands.ctranslate2_spec import save_model\n'
        'save_model(sys.argv[1])\n'
    )
    done = subprocess.run(
        [sys.executable, '-c', code, request_path],
        env={**os.environ, 'PYTHONPATH': os.pathsep.join(path)},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f'exit status {done.returncode}']
        raise error(f'The CTranslate2 export failed: {lines[-1][:300]}')


def save_model(request_path: str) -> None:
    """The child of `write_ctranslate2`: builds the TransformerSpec of the request, assigns
    its arrays by name, registers the vocabulary and the SentencePiece files, sets the config,
    validates, quantizes and saves."""
    from ctranslate2.specs import common_spec, model_spec, transformer_spec

    with open(request_path, encoding='utf-8') as f:
        request = json.load(f)
    stacks = []
    for name, spec_class in (
        ('encoder', transformer_spec.TransformerEncoderSpec),
        ('decoder', transformer_spec.TransformerDecoderSpec),
    ):
        options = dict(request['spec'][name])
        options['activation'] = common_spec.Activation[options['activation']]
        stacks.append(spec_class(**options))
    spec = transformer_spec.TransformerSpec(*stacks)
    if request['spec']['encoder']['rotary_dim'] is not None:
        # The encoder spec always declares position encodings (unless relative); rotary
        # positions have none (the decoder's declares none with a rotary_dim).
        del spec.encoder.position_encodings
    with np.load(request['weights']) as weights:
        for name in weights.files:
            scope, attribute = name.rsplit('/', 1)
            try:
                layer = model_spec.index_spec(spec, scope)
            except (AttributeError, ValueError, IndexError):
                layer = None
            if layer is None or not hasattr(layer, attribute):
                raise ValueError(f'{name} is no variable of the TransformerSpec.')
            setattr(layer, attribute, weights[name])
    spec.register_source_vocabulary(request['vocabulary'])
    spec.register_target_vocabulary(request['vocabulary'])
    for filename, path in request['files'].items():
        spec.register_file(path, filename)
    for key, value in request['config'].items():
        setattr(spec.config, key, value)
    spec.validate()
    spec.optimize(quantization=request['quantization'])
    os.makedirs(request['directory'])
    spec.save(request['directory'])
