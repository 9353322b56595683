"""A small MarianMT (OPUS-MT) directory as the Hugging Face hub serves one, built offline.

`build_marian_dir` writes what an OPUS-MT repository holds: ``source.spm`` and ``target.spm``
(SentencePiece unigram models with SentencePiece's default ids, unk 0 / bos 1 / eos 2, as
OPUS-MT's are), a joint ``vocab.json`` in the layout of OPUS-MT's first generation
(``layout='classic'``: ``'</s>'`` 0, ``'<unk>'`` 1, ``'<pad>'`` V-1) or of its
Tatoeba-Challenge generation (``layout='tc'``, ``opus-mt-tc-*``: ``'</s>'`` in the middle,
``'<unk>'`` three quarters in, ``'<pad>'`` last, and config.json's special ids saying so),
(``separate_vocabs=True``: a ``target_vocab.json`` of its own size beside it, unshared
embeddings), ``tokenizer_config.json``, ``special_tokens_map.json``, and ``config.json``,
the weights and ``generation_config.json`` written by transformers itself. The text is the
synthetic language pair (transformer/data/synthetic.py), so nothing is read from disk or the
network.

What makes it a useful test of a conversion:

- a few real pieces of each SentencePiece model are left out of vocab.json (`left_out_pieces`
  names them), so MarianTokenizer maps them to ``<unk>``, as it does for pieces that OPUS-MT's
  vocabularies lack; characters the models never saw (capitals, digits) do the same;
- every attention projection has a non-zero bias, ``final_logits_bias`` (a buffer) is
  non-zero and the layer norms are not the identity, so a converter that drops one of them
  gives other numbers;
- ``train_steps`` Adam steps on its first `TRAINED_LINES` lines make the outputs on them
  peaked: a random model's near ties make greedy and beam comparisons between implementations
  fragile.

Built in ~4 s on 2 cores (~2 s of them the 80 training steps; importing torch and transformers
~1.5 s more). Tests share one build per session, made in a process of its own, with
`marian_dir`::

    @pytest.fixture(scope='module')
    def hf_dir(tmp_path_factory):
        return marian_dir(tmp_path_factory, multilingual=True)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tests.shared_dirs import built_once
from tests.subprocess_env import repo_env
from transformer.data import synthetic

LANGUAGE_TOKENS = ('>>fra<<', '>>deu<<', '>>spa<<')  # multilingual=True: in vocab.json
LAYOUTS = ('classic', 'tc')
# The Tatoeba-Challenge generation's shape in small: its vocab.json layout, relu, several
# targets, and max_position_embeddings neither 512 (the first generation's) nor 1024.
TC = {'layout': 'tc', 'multilingual': True, 'activation': 'relu', 'max_positions': 64}
SOURCE_LANG, TARGET_LANG = 'en', 'de'  # tokenizer_config.json's (the text is synthetic)
LEFT_OUT_PER_MODEL = 3  # real pieces of each .spm that vocab.json leaves out
# The model is trained on the first TRAINED_LINES pairs and memorizes them: greedy search on
# their sources (multilingual: with any language token) has log-probability gaps over ~2 between
# its two best tokens at every step; on other lines they go down to ~0.005 in float32, and
# float16 weights tie there. Compare decoders on these lines.
TRAINED_LINES = 32


def synthetic_lines(count: int = 300, max_words: int = 10, seed: int = 0):
    """``count`` (source, target) pairs of the synthetic train split."""
    cfg = SimpleNamespace(
        seed=seed, num_train=count, num_validation=1, num_test=1, max_words=max_words
    )
    sources, targets = synthetic.read(SimpleNamespace(synthetic=cfg), 'train')
    return list(zip(sources, targets, strict=True))


def hf_log_probs(hf_model, batch) -> np.ndarray:
    """MarianMTModel's teacher-forced log-probabilities [B, T, V] of a tokenizer's ``batch``
    (its input_ids, attention_mask and labels), in its own id order."""
    import torch

    with torch.no_grad():
        logits = hf_model(
            input_ids=torch.as_tensor(np.array(batch['input_ids'])),
            attention_mask=torch.as_tensor(np.array(batch['attention_mask'])),
            labels=torch.as_tensor(np.array(batch['labels'])),
        ).logits
    return torch.log_softmax(logits, -1).numpy()


def build_marian_dir(
    directory: str | os.PathLike,
    *,
    lines: Sequence[tuple[str, str]] | None = None,
    multilingual: bool = False,
    vocab_size: int = 150,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    d_ff: int = 64,
    activation: str = 'swish',
    seed: int = 0,
    train_steps: int = 80,
    length_penalty: float = 1.0,
    layout: str = 'classic',
    max_positions: int = 512,
    separate_vocabs: bool = False,
) -> str:
    """Writes a MarianMT directory into ``directory`` (new or empty) and returns its path.

    Args:
      lines: (source, target) pairs the SentencePiece models and the model are trained on;
        None: 300 synthetic pairs (`synthetic_lines`).
      multilingual: vocab.json also holds `LANGUAGE_TOKENS` (between the pieces, not at the
        end), and each training source starts with one of them, as in OPUS-MT's models with
        several target languages.
      vocab_size: each SentencePiece model's (fewer when the text has fewer pieces).
      d_model, layers, heads, d_ff, activation: the MarianConfig's sizes (both stacks).
      seed: torch's seed for the initialization and the biases (the text does not change).
      train_steps: full-batch Adam steps on the first `TRAINED_LINES` pairs (0: a random
        model). The SentencePiece models are trained on all the lines.
      length_penalty: generation_config.json's.
      layout: where vocab.json puts its special pieces (`LAYOUTS`, module docstring).
      max_positions: config.json's max_position_embeddings (and generation's max_length).
      separate_vocabs: Marian's two vocabularies: vocab.json holds source.spm's pieces,
        target_vocab.json target.spm's (each with '</s>', '<unk>' and '<pad>' in ``layout``),
        tokenizer_config.json says separate_vocabs, and the model's embeddings are unshared
        (decoder_vocab_size is the target's size, 20 pieces fewer, the output tied to the
        decoder's embedding). Its pad ids differ by side (source 146, target 126): config.json
        holds the target's, and MarianTokenizer pads labels with the source's (`_train` masks
        them, `hf_log_probs` callers replace them).
    """
    import torch
    import transformers

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    pairs = list(lines) if lines is not None else synthetic_lines()
    if multilingual:
        pairs = [(f'{LANGUAGE_TOKENS[i % 3]} {s}', t) for i, (s, t) in enumerate(pairs)]
    codes = LANGUAGE_TOKENS if multilingual else ()
    vocab, target_vocab = _write_tokenizer(
        directory, pairs, vocab_size, codes, layout, separate_vocabs
    )
    size, pad, eos = len(vocab), target_vocab['<pad>'], target_vocab['</s>']
    config = transformers.MarianConfig(
        vocab_size=size,
        decoder_vocab_size=len(target_vocab),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        activation_function=activation,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        forced_eos_token_id=eos,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=not separate_vocabs,
        tie_word_embeddings=True,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        architectures=['MarianMTModel'],
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config)
    _perturb(model, torch)
    if train_steps:
        tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
        _train(model, tokenizer, pairs, train_steps, torch)
    model.eval()
    model.generation_config = transformers.GenerationConfig(
        num_beams=4,
        length_penalty=length_penalty,
        max_length=max_positions,
        bad_words_ids=[[pad]],
        decoder_start_token_id=pad,
        pad_token_id=pad,
        eos_token_id=eos,
        forced_eos_token_id=eos,
    )
    model.save_pretrained(directory)
    return directory


def marian_dir(tmp_path_factory, **kwargs) -> str:
    """`build_marian_dir(..., **kwargs)`, built once per test session for each set of
    arguments and shared by pytest-xdist's workers (tests/shared_dirs.py). Read it only."""
    key = hashlib.sha256(repr(sorted(kwargs.items())).encode()).hexdigest()[:12]
    path = built_once(tmp_path_factory, f'marian-{key}', lambda path: _build_apart(path, kwargs))
    return str(path)


def _build_apart(path: Path, kwargs: dict) -> None:
    """`build_marian_dir` in a process of its own: the test worker that asks never trains
    torch beside the jax computations it runs (a worker doing both was lost without a
    traceback now and then)."""
    code = (
        'import json, sys\n'
        'from tests.marian_dir import build_marian_dir\n'
        'build_marian_dir(sys.argv[1], **json.loads(sys.argv[2]))\n'
    )
    done = subprocess.run(
        [sys.executable, '-c', code, str(path), json.dumps(kwargs)],
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise RuntimeError(f'Building the MarianMT directory failed:\n{done.stderr[-3000:]}')


def left_out_pieces(directory: str | os.PathLike) -> set[str]:
    """The real pieces of source.spm or target.spm that vocab.json lacks (MarianTokenizer
    maps them to '<unk>')."""
    import sentencepiece as spm

    directory = Path(directory)
    vocab = json.loads((directory / 'vocab.json').read_text(encoding='utf-8'))
    gone = set()
    for name in ('source.spm', 'target.spm'):
        sp = spm.SentencePieceProcessor(model_file=str(directory / name))
        real = (sp.id_to_piece(i) for i in range(sp.get_piece_size()) if _is_real(sp, i))
        gone |= {p for p in real if p not in vocab}
    return gone


def _write_tokenizer(
    directory: str,
    pairs,
    vocab_size: int,
    language_tokens: Sequence[str],
    layout: str,
    separate_vocabs: bool = False,
) -> tuple[dict[str, int], dict[str, int]]:
    """source.spm, target.spm, vocab.json (and target_vocab.json) and the tokenizer's
    configs; the source's and the target's vocabulary maps (one map, twice, when joint)."""
    import sentencepiece as spm

    texts = {'source': [_strip_code(s) for s, _ in pairs], 'target': [t for _, t in pairs]}
    pieces, gone, sides = [], set(), {}
    for side in ('source', 'target'):
        # Separate vocabularies of different sizes: decoder_vocab_size != vocab_size.
        smaller = separate_vocabs and side == 'target'
        proto = _train_spm(spm, texts[side], vocab_size - 20 if smaller else vocab_size)
        with open(os.path.join(directory, f'{side}.spm'), 'wb') as f:
            f.write(proto)
        sp = spm.SentencePieceProcessor(model_proto=proto)
        real = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if _is_real(sp, i)]
        pieces += real
        # Frequent pieces (unigram models list them by score), so fixture lines hold unks;
        # not single letters, which would leave too little for the model to learn.
        longer = [p for p in real if len(p.lstrip('▁')) > 1]
        gone |= set(longer[4 : 4 + 4 * LEFT_OUT_PER_MODEL : 4])
        sides[side] = real
    if separate_vocabs:
        vocab = _joint_vocab([p for p in sides['source'] if p not in gone], language_tokens, layout)
        target_vocab = _joint_vocab([p for p in sides['target'] if p not in gone], (), layout)
        _write_json(directory, 'target_vocab.json', target_vocab)
    else:
        vocab = _joint_vocab([p for p in pieces if p not in gone], language_tokens, layout)
        target_vocab = vocab
    _write_json(directory, 'vocab.json', vocab)
    special = {'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}
    _write_json(directory, 'special_tokens_map.json', special)
    _write_json(
        directory,
        'tokenizer_config.json',
        {
            'source_lang': SOURCE_LANG,
            'target_lang': 'mul' if language_tokens else TARGET_LANG,
            'separate_vocabs': separate_vocabs,
            'model_max_length': 512,
            'sp_model_kwargs': {},
            'tokenizer_class': 'MarianTokenizer',
            **special,
        },
    )
    return vocab, target_vocab


def _strip_code(text: str) -> str:
    """``text`` without a leading language code, as MarianTokenizer feeds it to the model."""
    if text.startswith('>>') and (end := text.find('<<')) != -1:
        return text[end + 2 :]
    return text


def _is_real(sp, i: int) -> bool:
    return not (sp.is_unknown(i) or sp.is_control(i) or sp.is_unused(i))


def _train_spm(spm, sentences: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type='unigram',
        hard_vocab_limit=False,
        input_sentence_size=0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def _joint_vocab(pieces: list[str], language_tokens: Sequence[str], layout: str) -> dict[str, int]:
    """The pieces (each once) with the language tokens in their middle, and '<pad>' last;
    'classic': '</s>' 0, '<unk>' 1 first; 'tc': '</s>' in the middle (after the language
    tokens), '<unk>' three quarters in."""
    if layout not in LAYOUTS:
        raise ValueError(f'layout must be one of {LAYOUTS}, got {layout!r}.')
    unique = list(dict.fromkeys(pieces))
    half, three_quarters = len(unique) // 2, 3 * len(unique) // 4
    if layout == 'classic':
        ordered = ['</s>', '<unk>', *unique[:half], *language_tokens, *unique[half:]]
    else:
        ordered = [*unique[:half], *language_tokens, '</s>', *unique[half:three_quarters]]
        ordered += ['<unk>', *unique[three_quarters:]]
    return {piece: i for i, piece in enumerate([*ordered, '<pad>'])}


def _perturb(model, torch) -> None:
    """Non-zero attention biases and final_logits_bias, layer norms off the identity."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(('q_proj.bias', 'k_proj.bias', 'v_proj.bias', 'out_proj.bias')):
                parameter.normal_(0.0, 0.1)
            elif 'layer_norm' in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
        model.final_logits_bias.normal_(0.0, 0.5)


def _train(model, tokenizer, pairs, steps: int, torch) -> None:
    """Full-batch Adam steps on the first `TRAINED_LINES` of ``pairs``: peaked outputs, no
    near ties. On one thread with eager attention: 3x faster than torch's defaults for a
    model this small (~25 ms a step)."""
    sources, targets = zip(*pairs[:TRAINED_LINES], strict=True)
    batch = tokenizer(list(sources), text_target=list(targets), padding=True, return_tensors='pt')
    batch['labels'][batch['labels'] == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads, attention = torch.get_num_threads(), model.config._attn_implementation
    torch.set_num_threads(1)
    model.set_attn_implementation('eager')
    model.eval()  # without dropout: memorizes in fewer steps
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
        model.set_attn_implementation(attention)


def _write_json(directory: str, name: str, value) -> None:
    with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
        json.dump(value, f, ensure_ascii=False, indent=2)
