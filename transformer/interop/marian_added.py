"""Tokens added to a MarianMT vocabulary (transformer/data/added_tokens.py: the syntax, the
checks), in the files Hugging Face reads: vocab.json gets the new pieces at its end, and
tokenizer_config.json's ``added_tokens_decoder`` registers each as a special token, so
MarianTokenizer cuts it out of the text and maps it to its id wherever it stands (and
`MarianVocabulary.encode` does the same); decoding drops it.
"""

from __future__ import annotations

import json
import os
from typing import Any

ADDED_KEY = 'added_tokens_decoder'  # tokenizer_config.json's, as transformers writes it


def write(vocab: Any, added: list[tuple[str, str | None]], directory: str) -> None:
    """``vocab``'s files (a `MarianVocabulary`) written into ``directory`` (existing, empty)
    with ``added`` (checked by ``data.added_tokens.check``) at the end of vocab.json and
    registered in tokenizer_config.json (module docstring)."""
    vocab.copy_to(directory)
    path = os.path.join(directory, 'vocab.json')
    with open(path, encoding='utf-8') as f:
        pieces = json.load(f)
    config_path = os.path.join(directory, 'tokenizer_config.json')
    config: dict[str, Any] = {'tokenizer_class': 'MarianTokenizer'}
    if os.path.isfile(config_path):
        with open(config_path, encoding='utf-8') as f:
            config = json.load(f)
    registered = dict(config.get(ADDED_KEY) or {})
    for name, _ in added:
        registered[str(len(pieces))] = {
            'content': name,
            'lstrip': False,
            'normalized': False,
            'rstrip': False,
            'single_word': False,
            'special': True,
        }
        pieces[name] = len(pieces)
    config[ADDED_KEY] = registered
    for file, value in ((path, pieces), (config_path, config)):
        with open(file, 'w', encoding='utf-8') as f:
            json.dump(value, f, indent=2, ensure_ascii=False)
            f.write('\n')


def registered(config: dict[str, Any]) -> list[str]:
    """The tokens tokenizer_config.json (``config``) registers as added (`ADDED_KEY`)."""
    entries = config.get(ADDED_KEY) or {}
    if not isinstance(entries, dict):
        return []
    return [e.get('content') if isinstance(e, dict) else e for e in entries.values()]
