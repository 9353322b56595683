"""Language codes on the training pairs of a multilingual vocabulary (NLLB-200's ``eng_Latn``,
M2M100's ``__en__``, mBART-50's ``en_XX``): the source code first in every source, the target
code first in every target's labels, as the vocabulary's `prefixes` lays a pair out (decoding
then starts from the decoder's start token and forces the target code first). The one way
this package puts language codes on training pairs; the pair of a run is
``data.source_lang_code`` / ``data.target_lang_code``, and a ``data.mix`` entry may carry its
own (mix_entries.py).

A vocabulary has language codes when it lays pairs out by them (its ``prefixes``) and has
some; a bilingual vocabulary, a joint SentencePiece model and a MarianMT's (whose
multilingual models take a ``>>fra<<`` token: source_tag.py) have none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from transformer.data.errors import DataError
from transformer.data.pretokenize import Side

KEYS = ('data.source_lang_code', 'data.target_lang_code')


def has_codes(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` lays a pair out by language codes (module docstring)."""
    return callable(getattr(tokenizer, 'prefixes', None)) and bool(tokenizer.language_tokens())


class LanguagePair:
    """``tokenizer`` with the source code's id first in every encoded source and the target
    code's first in every encoded target (the labels); decoding and the rest of its interface
    are ``tokenizer``'s. Its fingerprint includes the codes, so the token caches and stores of
    different pairs never mix.

    Attributes:
      source_code, target_code: the codes as given.
      forced: the ids a search forces first in each output (the target code), as the labels
        hold them.
    """

    def __init__(self, tokenizer: Any, source_code: str, target_code: str, keys=KEYS):
        self.tokenizer, self.source_code, self.target_code = tokenizer, source_code, target_code
        for key, code in zip(keys, (source_code, target_code), strict=True):
            tokenizer.language_id(code, key)  # a code it lacks: one line naming ``key``
        ids = tokenizer.prefixes(source_code, target_code)
        self._first = {'source': list(ids.source), 'target': list(ids.target)}
        self.forced = tuple(ids.target)
        self.fingerprint = f'{tokenizer.fingerprint}+{source_code}->{target_code}'

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        return [*self._first[side], *self.tokenizer.encode(text, side)]

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        first = self._first[side]
        return [[*first, *ids] for ids in self.tokenizer.encode_batch(texts, side)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(ids)

    def __getattr__(self, name: str) -> Any:  # vocab_size, special, id_to_piece, ...
        return getattr(self.tokenizer, name)


def few_codes(codes: Sequence[str]) -> str:
    """``'202 language codes: ace_Arab, ace_Latn, acm_Arab, ...'``: how a one-line error names
    a vocabulary's codes."""
    return f'{len(codes)} language codes: ' + ', '.join(codes[:3]) + ', ...'


def with_pair(
    tokenizer: Any,
    source_code: str | None,
    target_code: str | None,
    keys: tuple[str, str] = KEYS,
    vocabulary: str = 'the vocabulary',
) -> Any:
    """``tokenizer`` with the pair's codes on its pairs (`LanguagePair`); ``tokenizer`` itself
    for a pair of None where it has no codes. ``keys`` name the settings of the two codes and
    ``vocabulary`` the vocabulary in errors; ``tokenizer`` None: a vocabulary to be made (a
    joint SentencePiece model, which has no codes).

    Raises:
      DataError: one line: a vocabulary with codes and no pair, a pair on one without codes,
        one code of the two, or a code it lacks (naming a few codes and their count).
    """
    given = [
        (key, code) for key, code in zip(keys, (source_code, target_code), strict=True) if code
    ]
    codes = tokenizer is not None and has_codes(tokenizer)
    if not given:
        if codes:
            languages = tokenizer.language_tokens()
            raise DataError(
                f'{vocabulary} is multilingual ({few_codes(languages)}): set {keys[0]} and '
                f'{keys[1]} to the language pair trained on (e.g. {languages[0]!r} and '
                f'{languages[1]!r}).'
            )
        return tokenizer
    key, code = given[0]
    if not codes:
        raise DataError(
            f'{key}={code!r} names a language code, but {vocabulary} has none (a bilingual '
            'or joint SentencePiece vocabulary): remove it.'
        )
    if len(given) == 1:
        other = keys[1] if key == keys[0] else keys[0]
        raise DataError(f'{key}={code!r} needs {other} too: a pair has both codes.')
    return LanguagePair(tokenizer, source_code, target_code, keys)


def forced(tokenizer: Any) -> tuple[int, ...]:
    """The ids a search forces first for ``tokenizer``'s pairs (its target code), () for a
    vocabulary without a pair."""
    return tokenizer.forced if isinstance(tokenizer, LanguagePair) else ()
