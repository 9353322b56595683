"""A reserved token first in every source: a multilingual model's target-language token
(OPUS-MT's ``>>fra<<``) or a corpus tag, prepended as the token's id, never as text that a
user's sentence could also contain. The one way this package prepends a reserved token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from transformer.data.errors import DataError
from transformer.data.pretokenize import Side


def _named(tokens: Sequence[str], limit: int = 5) -> str:
    shown = ', '.join(tokens[:limit])
    return f'{len(tokens)} such tokens: {shown}' + (', ...' if len(tokens) > limit else '')


class SourceTagged:
    """``tokenizer`` with the id of the piece ``tag`` first in every encoded source; the
    targets, decoding and the rest of its interface are ``tokenizer``'s. Its fingerprint
    includes the tag, so token caches of tagged and untagged sources never mix."""

    def __init__(self, tokenizer: Any, tag: str, tag_id: int):
        self.tokenizer, self.tag, self.tag_id = tokenizer, tag, tag_id
        self.fingerprint = f'{tokenizer.fingerprint}+{tag}'

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        ids = self.tokenizer.encode(text, side)
        return [self.tag_id, *ids] if side == 'source' else ids

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        encoded = self.tokenizer.encode_batch(texts, side)
        return [[self.tag_id, *ids] for ids in encoded] if side == 'source' else encoded

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(ids)

    def __getattr__(self, name: str) -> Any:  # vocab_size, id_to_piece, pretokenizer, ...
        return getattr(self.tokenizer, name)


def tag_sources(tokenizer: Any, tag: str | None, key: str = '--source_tag') -> Any:
    """``tokenizer`` with ``tag`` first in every source (`SourceTagged`); ``tokenizer`` itself
    when ``tag`` is None. ``key`` names the setting in errors.

    Raises:
      DataError: ``tag`` is not a piece of the vocabulary, or a multilingual vocabulary (one
        with target-language tokens) was given no tag.
    """
    languages = list(tokenizer.language_tokens())
    if tag is None:
        if languages:
            raise DataError(
                f'This model is multilingual ({_named(languages)}): give {key} with the '
                "target language's token, e.g. " + f"{key}='{languages[0]}'."
            )
        return tokenizer
    tag_id = tokenizer.token_id(tag)
    if tag_id is None:
        known = f' The vocabulary has {_named(languages)}.' if languages else ''
        if hasattr(tokenizer, 'added'):  # a pretrained (MarianMT) vocabulary grows
            known += f" Add it with train.add_tokens='{tag}' (docs/pretrained.md)."
        raise DataError(f'{key}={tag!r} is not a token of the vocabulary.{known}')
    return SourceTagged(tokenizer, tag, tag_id)
