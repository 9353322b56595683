"""The MarianMT family (Hugging Face MarianMT, OPUS-MT): its directories read as this
project's models, the config mapped onto the ``model`` and ``eval`` sections, the weights onto
the parameter tree (marian_params.py), its vocabulary (marian_vocab.py, marian_added.py) and
its export (marian_export.py); `FAMILY` is its entry in the registry (families.py).

A MarianMT is the paper's post-LN Transformer with a few options this project declares as
model variants and settings (transformer/model/variants.py, settings.py): the feed-forward's
activation (``model.ffn``: 'swish', 'gelu', 'relu'), biases on the attention projections
(``model.attention_bias``), the output bias ``final_logits_bias`` (``model.logits_bias``)
and layer norm epsilon 1e-5. Two layouts differ and are mapped exactly, each a permutation:

* Sinusoid channels: Marian puts all sines first, then all cosines; ours interleave them
  (`marian_channel_order`). Every weight that touches the residual stream is permuted on its
  D axis, which gives the same function (layer norm and the tied logits are invariant to it).
* Vocabulary rows: Marian's eos, unk and pad (also the decoder start) are where vocab.json
  puts them (0, 1 and V - 1 in OPUS-MT's first generation, anywhere in its ``opus-mt-tc-*``
  generation); ours are pad 0 (the decoder start), eos 1, unk 2 (transformer/tokens.py). One
  permutation read from vocab.json maps Marian's ids onto ours (`MarianVocabulary`,
  marian_vocab.py), and the embedding rows and the output bias move by it. config.json's and
  generation_config.json's special ids must be vocab.json's (`check_special_ids`).

* Separate vocabularies (tokenizer_config.json's ``separate_vocabs``, a target_vocab.json of
  ``decoder_vocab_size`` pieces, unshared embeddings, the output tied to the decoder's): the
  model's ``share_embeddings`` 'target', one permutation per side, each table padded to the
  larger side's size (marian_vocab.py says how the padding is never read nor emitted).

Values Hugging Face's Marian acts on that this model cannot express (unshared embeddings of
one joint vocabulary, different encoder and decoder head counts or widths, another
``model_type``, a decoder start other than pad) stop in one `MarianError` naming the key,
before anything is written;
keys Hugging Face's Marian ignores (``normalize_before``, ``static_position_embeddings``,
...) are ignored here too.
A ``bad_words_ids`` entry of several tokens stops the same way. The generation settings
``generate`` reads become the run's decoding settings (`eval_settings`; the single tokens
``bad_words_ids`` bans, its ``data.never_emit``: `banned_ids`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformer.data import DataError
from transformer.interop import generation as generation_lib
from transformer.interop import marian_added, marian_export
from transformer.interop.family import Family, Pretrained
from transformer.interop.generation import (
    CONFIG_FILE,
    GENERATION_FILE,
    generation_settings,
    single_token_bans,
)
from transformer.interop.marian_params import (
    MarianError,
    params_from_state_dict,
    read_state_dict,
)
from transformer.interop.marian_vocab import MarianVocabulary

TOKENIZER_CONFIG = 'tokenizer_config.json'
# Hugging Face's activation names -> model.ffn (ACT2FN: 'silu' and 'swish' are one function).
ACTIVATIONS = {'swish': 'swish', 'silu': 'swish', 'gelu': 'gelu', 'relu': 'relu'}
# Marian's layer norms are torch's default nn.LayerNorm.
LAYER_NORM_EPSILON = 1e-5


def recognises(path: str) -> bool:
    """Whether ``path`` looks like a MarianMT directory (a config.json of model_type 'marian'
    and no run directory's checkpoints)."""
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config) or os.path.isdir(os.path.join(path, 'checkpoints')):
        return False
    try:
        with open(config, encoding='utf-8') as f:
            return json.load(f).get('model_type') == 'marian'
    except (OSError, ValueError, AttributeError):
        return False


def _read_json(directory: str, name: str, required: bool = True) -> dict[str, Any]:
    file = os.path.join(directory, name)
    if not os.path.isfile(file):
        if required:
            raise MarianError(
                f'{file} not found: --from_hf names a MarianMT directory as the '
                'hub serves it (config.json, model.safetensors, source.spm, '
                'target.spm, vocab.json).'
            )
        return {}
    try:
        with open(file, encoding='utf-8') as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise MarianError(f'{file} is not valid JSON ({e}).') from None
    if not isinstance(value, dict):
        raise MarianError(f'{file} holds {type(value).__name__}, not a JSON object.')
    return value


def check_expressible(hf: dict[str, Any], file: str, separate: bool = False) -> None:
    """A `MarianError` naming the first key of a MarianMT config.json (``file``) whose value
    this model cannot express; ``separate``: its tokenizer has separate vocabularies
    (tokenizer_config.json's separate_vocabs), whose embeddings are the encoder's and the
    decoder's, the output tied to the decoder's."""

    def refuse(key: str, why: str) -> MarianError:
        return MarianError(f'{file}: {key}={hf.get(key)!r} {why}')

    if hf.get('model_type') != 'marian':
        raise refuse('model_type', "is not a MarianMT ('marian'); only MarianMT converts.")
    vocab = hf.get('vocab_size')
    if not separate and hf.get('decoder_vocab_size') not in (None, vocab):
        raise refuse(
            'decoder_vocab_size',
            f'differs from vocab_size={vocab}: a separate decoder vocabulary needs '
            "tokenizer_config.json's separate_vocabs=true and a target_vocab.json.",
        )
    shared = hf.get('share_encoder_decoder_embeddings', True)
    if separate and shared is not False:
        raise refuse(
            'share_encoder_decoder_embeddings',
            "is not expressible with tokenizer_config.json's separate_vocabs=true: "
            'separate vocabularies have an embedding each (set it to false).',
        )
    if not separate and shared is not True:
        raise refuse(
            'share_encoder_decoder_embeddings',
            'is not expressible with one joint vocabulary: its source and target embeddings '
            "and the output projection are one matrix (Sec. 3.4); tokenizer_config.json's "
            'separate_vocabs=true gives unshared ones.',
        )
    for key in ('tie_word_embeddings', 'scale_embedding'):
        if hf.get(key, True) is not True:
            raise refuse(
                key,
                'is not expressible: the output projection is the target embedding, '
                'scaled by sqrt(d_model) (Sec. 3.4).',
            )
    for ours, encoder, decoder in (
        ('num_heads', 'encoder_attention_heads', 'decoder_attention_heads'),
        ('d_ff', 'encoder_ffn_dim', 'decoder_ffn_dim'),
    ):
        if hf.get(encoder) != hf.get(decoder):
            raise refuse(
                decoder,
                f'differs from {encoder}={hf.get(encoder)!r}: one model.{ours} serves both stacks.',
            )
    activation = hf.get('activation_function', 'gelu')
    if activation not in ACTIVATIONS:
        raise refuse('activation_function', f'is not one of {", ".join(ACTIVATIONS)}.')


def check_special_ids(keys: dict[str, Any], ids: dict[str, int], file: str) -> None:
    """A `MarianError` naming the first special id of config.json or generation_config.json
    (``keys``, read from ``file``) that is not vocab.json's (``ids``: its Marian pad, eos and
    unk, `MarianVocabulary.marian_special_ids`). A key left out or null is not checked:
    transformers takes it from the other file or goes without it."""
    pad, eos = ids['pad'], ids['eos']
    wanted = {
        'eos_token_id': (eos, "vocab.json's '</s>'"),
        'forced_eos_token_id': (
            eos,
            "vocab.json's '</s>', which ends a sentence at the length limit",
        ),
        'pad_token_id': (pad, "vocab.json's '<pad>'"),
        'decoder_start_token_id': (pad, "vocab.json's '<pad>': the decoder starts with pad here"),
    }
    for key, (want, what) in wanted.items():
        value = keys.get(key)
        if value is not None and value != want:
            raise MarianError(f'{file}: {key}={value!r} is not {want!r} ({what}).')


def banned_ids(keys: dict[str, Any], vocabulary: MarianVocabulary, file: str) -> list[int]:
    """Our ids of the single tokens ``bad_words_ids`` (of ``keys``, read from ``file``) bans
    (`generation.single_token_bans`: each at every step, eos left out, as ``generate``)."""
    size, eos = vocabulary.vocab_size, vocabulary.marian_special_ids()['eos']
    banned = single_token_bans(keys, size, eos, file, MarianError)
    return [vocabulary.our_id(i) for i in banned]


def _with_banned(
    vocabulary: MarianVocabulary, hf: dict[str, Any], generation: dict[str, Any] | None
) -> MarianVocabulary:
    """``vocabulary`` with the ids ``bad_words_ids`` bans as never emitted, read from the one
    file ``generate`` reads it from (`generation_settings`): generation_config.json
    (``generation``) when there is one, else config.json (``hf``)."""
    directory = vocabulary.directory
    keys, name = (hf, CONFIG_FILE) if generation is None else (generation, GENERATION_FILE)
    banned = banned_ids(keys, vocabulary, os.path.join(directory, name))
    return MarianVocabulary(directory, never_emit=banned) if banned else vocabulary


def model_settings(hf: dict[str, Any], file: str, separate: bool = False) -> dict[str, Any]:
    """The ``model`` section of a MarianMT config.json (``file`` names it in errors);
    ``separate``: separate vocabularies (`check_expressible`).

    Raises:
      MarianError: a value this model cannot express, naming the key (`check_expressible`).
    """
    check_expressible(hf, file, separate)
    return {
        'd_model': hf['d_model'],
        'num_heads': hf['encoder_attention_heads'],
        'd_ff': hf['encoder_ffn_dim'],
        'num_encoder_layers': hf['encoder_layers'],
        'num_decoder_layers': hf['decoder_layers'],
        'ffn': ACTIVATIONS[hf.get('activation_function', 'gelu')],
        'attention_bias': True,
        'logits_bias': True,
        'layer_norm_epsilon': LAYER_NORM_EPSILON,
        'dropout_rate': float(hf.get('dropout', 0.1)),
        'attention_dropout_rate': float(hf.get('attention_dropout', 0.0)),
        'relu_dropout_rate': float(hf.get('activation_dropout', 0.0)),
        # Separate vocabularies: the encoder's and the decoder's tables, the output tied to
        # the decoder's ('target').
        'share_embeddings': 'target' if separate else 'all',
        'pre_layer_norm': False,
    }


def eval_settings(generation: dict[str, tuple[Any, str]], directory: str) -> dict[str, Any]:
    """The ``eval`` settings of `generation_settings` (`generation.eval_settings`)."""
    return generation_lib.eval_settings(generation, directory, MarianError)


def _check_sizes(hf: dict[str, Any], tokenizer: MarianVocabulary, file: str) -> None:
    """A `MarianError` unless config.json's (``hf``, read from ``file``) vocab_size is
    vocab.json's number of pieces and, with separate vocabularies, its decoder_vocab_size
    target_vocab.json's."""
    files = {'source': 'vocab.json', 'target': 'target_vocab.json'}
    keys = {'source': 'vocab_size', 'target': 'decoder_vocab_size'}
    for side in ('source', 'target') if tokenizer.separate else ('source',):
        if hf.get(keys[side]) != tokenizer.sizes[side]:
            raise MarianError(
                f'{file}: {keys[side]}={hf.get(keys[side])!r} but {files[side]} holds '
                f'{tokenizer.sizes[side]} pieces: make the two agree.'
            )


def load(directory: str, weights: bool = True) -> Pretrained:
    """Reads a MarianMT directory: its config (checked first), vocabulary and (``weights``)
    parameters. Nothing is downloaded; every problem is one `MarianError`. Its `Pretrained`'s
    ``eval`` is `eval_settings`, ``generation`` `generation_settings`, ``languages``
    tokenizer_config.json's, ``files`` its config.json and generation_config.json as read
    (marian_export.py writes them back)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise MarianError(
            f'{directory} is not a directory: --from_hf names a local MarianMT '
            "directory (download one with the hub's own tool first)."
        )
    file = os.path.join(directory, CONFIG_FILE)
    hf = _read_json(directory, CONFIG_FILE)
    tokenizer_config = _read_json(directory, TOKENIZER_CONFIG, required=False)
    separate = tokenizer_config.get('separate_vocabs') is True
    model = model_settings(hf, file, separate)
    if model['d_model'] % model['num_heads'] or model['d_model'] % 2:
        raise MarianError(
            f'{file}: d_model={model["d_model"]} must be even and a multiple of '
            f'encoder_attention_heads={model["num_heads"]}.'
        )
    has_generation = os.path.isfile(os.path.join(directory, GENERATION_FILE))
    generation_file = _read_json(directory, GENERATION_FILE) if has_generation else None
    generation = generation_settings(generation_file, hf)
    settings = eval_settings(generation, directory)
    try:
        tokenizer = MarianVocabulary(directory)
    except DataError as e:
        raise MarianError(str(e)) from None
    _check_sizes(hf, tokenizer, file)
    ids = tokenizer.marian_special_ids()
    check_special_ids(hf, ids, file)
    if generation_file is not None:
        check_special_ids(generation_file, ids, os.path.join(directory, GENERATION_FILE))
    tokenizer = _with_banned(tokenizer, hf, generation_file)
    params = None
    if weights:
        state = read_state_dict(directory)
        params = params_from_state_dict(state, model, tokenizer, directory)
    languages = (tokenizer_config.get('source_lang'), tokenizer_config.get('target_lang'))
    files = {CONFIG_FILE: hf, GENERATION_FILE: generation_file}
    return Pretrained(
        'marian', directory, model, settings, generation, languages, tokenizer, params, files
    )


def tokenizer_files(vocabulary: MarianVocabulary) -> dict[str, str]:
    """Its two SentencePiece models, by their names in a model directory."""
    return {name: os.path.join(vocabulary.directory, name) for name in marian_export.SPM_FILES}


FAMILY = Family(
    name='marian',
    title='MarianMT',
    model_types=('marian',),
    recognises=recognises,
    load=load,
    owns_vocabulary=lambda vocabulary: isinstance(vocabulary, MarianVocabulary),
    holds_vocabulary=MarianVocabulary.holds,
    load_vocabulary=MarianVocabulary,
    write_vocabulary=marian_added.write,
    tokenizer_files=tokenizer_files,
    writes=marian_export.WRITES,
    write=marian_export.write_hf,
)
