"""An NLLB-200, M2M100 or mBART-50 vocabulary (fairseq_vocab.py's `FairseqVocabulary`) written
back as files transformers 5 reads with the same ids (`write`), with tokens added at its end (a
new language code, a corpus tag; data/added_tokens.py).

The files: the vocabulary's own (``sentencepiece.bpe.model``, ``tokenizer.json``,
``vocab.json``, ``special_tokens_map.json``, as they came) and a ``tokenizer_config.json`` whose
``added_tokens_decoder`` registers every token past the pieces at its id: the codes and
``<mask>``, the rows past the tokenizer's up to V (``madeupwordNNNN``, fairseq_vocab.py), then
the added tokens at V, V + 1, ... in the order given. transformers 5 registers those entries
first and in id order, before the named special tokens and the codes it would append itself
(fairseq_backend.py `register`), and ``M2M100Tokenizer`` takes them at their ids, so both read
the written directory with these ids; a new language code is also listed with the codes
(``extra_special_tokens``), so ``NllbTokenizer`` and ``MBart50Tokenizer`` treat it as one.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from transformer.data import DataError
from transformer.interop.fairseq_backend import MASK
from transformer.interop.fairseq_vocab_files import (
    CLASS_OF,
    CODE_FORMS,
    SPECIAL_TOKENS_MAP,
    SPM_FILE,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    VOCAB_JSON,
)

ADDED_KEY = 'added_tokens_decoder'
COPIED = (SPM_FILE, TOKENIZER_JSON, VOCAB_JSON, SPECIAL_TOKENS_MAP)


def _entry(content: str, previous: Any = None) -> dict[str, Any]:
    """An ``added_tokens_decoder`` entry: the one the files had, else a special token's
    (``<mask>`` takes the space before it, as both families' tokenizers make it)."""
    if isinstance(previous, dict) and previous.get('content') == content:
        return dict(previous)
    mask = content == MASK
    return {
        'content': content,
        'lstrip': mask,
        'normalized': mask,
        'rstrip': False,
        'single_word': False,
        'special': True,
    }


def write(
    vocab: Any,
    added: list[tuple[str, str | None]],
    directory: str,
    keep: bool = False,
) -> None:
    """The files of ``vocab`` (a `FairseqVocabulary`) written into ``directory`` (existing;
    empty unless ``keep``, which keeps the files there) with ``added`` ([(name, like or
    None)], checked by ``data.added_tokens.check``) at ids V, V + 1, ... (module docstring)."""
    for name, _ in added:
        if vocab.token_id(name) is not None:
            raise DataError(
                f'{name!r} is already a token of the vocabulary (id {vocab.token_id(name)}).'
            )
    config = dict(vocab.config)
    config.setdefault('tokenizer_class', CLASS_OF[vocab.kind])
    previous = config.get(ADDED_KEY) if isinstance(config.get(ADDED_KEY), dict) else {}
    registered = {}
    for i in vocab.registered:
        piece = vocab.id_to_piece(i)
        registered[str(i)] = _entry(piece, previous.get(str(i)))
    names = [vocab.id_to_piece(i) for i in range(vocab.size, vocab.rows)]
    names += [name for name, _ in added]
    for offset, name in enumerate(names):
        registered[str(vocab.size + offset)] = _entry(name)
    config[ADDED_KEY] = registered
    if vocab.kind != 'm2m100':
        form = CODE_FORMS[vocab.kind]
        codes = vocab.language_tokens() + [n for n, _ in added if form.fullmatch(n)]
        config['extra_special_tokens'] = codes
        config.pop('additional_special_tokens', None)
    for name in COPIED:
        source, target = (os.path.join(d, name) for d in (vocab.directory, directory))
        if os.path.isfile(source) and not (keep and os.path.exists(target)):
            shutil.copyfile(source, target)
    path = os.path.join(directory, TOKENIZER_CONFIG)
    if keep and os.path.exists(path):
        return
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write('\n')
