"""The language pair a decode is for: a multilingual run's source and target language codes
(NLLB-200's ``eng_Latn``, M2M100's ``en`` / ``__en__``, mBART-50's ``en_XX``) made the ids
its vocabulary puts around a sentence pair. The one place the decoding commands (translate,
evaluate, score) and the Python API turn ``--source_lang`` / ``--target_lang`` into ids.

A run is multilingual when its vocabulary has language codes and lays a pair out around
them (``prefixes``: fairseq_vocab.py's NLLB-200, M2M100 and mBART-50 vocabularies). Then
every source starts with the source code, as its id (source_tag.py's `SourceTagged`, so the
source reads ``[src_code] X </s>``), and every output is forced to start with the target
code (`Languages.forced`: Hugging Face's ``forced_bos_token_id``), after the decoder's start
token, which the run's config records. Decoding skips the codes in the output text.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer.data.errors import DataError
from transformer.data.language_pair import few_codes, has_codes
from transformer.data.source_tag import SourceTagged, tag_sources

FLAGS = ('--source_lang', '--target_lang')  # the settings' names in messages
RECORDED = ('source_lang_code', 'target_lang_code')  # a run's data section, where it has them


@dataclasses.dataclass(frozen=True)
class Languages:
    """A decode's vocabulary and the ids every output starts with.

    Attributes:
      tokenizer: the run's vocabulary, with the source code (or ``--source_tag``'s token)
        first in every source.
      forced: the ids every output is forced to start with (the target code), () for a
        bilingual run.
      pair: (source code, target code) as given or recorded; None for a bilingual run.
    """

    tokenizer: Any
    forced: tuple[int, ...] = ()
    pair: tuple[str, str] | None = None


def recorded_pair(data_config: Any) -> tuple[str | None, str | None]:
    """The pair a run's ``data`` section names (``data.source_lang_code`` and
    ``data.target_lang_code``), each None where it names none."""
    if data_config is None:
        return None, None
    return tuple(getattr(data_config, key, None) or None for key in RECORDED)


def _bilingual(tokenizer: Any, given: tuple, source_tag: str | None, later: bool) -> Languages:
    """`languages_of` for a vocabulary without codes: ``source_tag`` alone; ``given``, the
    (flag, code) pairs given, refused in one line."""
    if given:
        flag, code = given[0]
        tokens = list(tokenizer.language_tokens())
        how = (
            f'its target-language tokens ({tokens[0]}, ...) go first in the source with '
            '--source_tag'
            if tokens
            else 'a bilingual run'
        )
        raise DataError(
            f'{flag}={code!r}: this run has no language codes ({how}); drop --source_lang and '
            '--target_lang.'
        )
    if later and source_tag is None:
        return Languages(tokenizer)
    return Languages(tag_sources(tokenizer, source_tag))


def languages_of(
    tokenizer: Any,
    source_lang: str | None = None,
    target_lang: str | None = None,
    *,
    source_tag: str | None = None,
    data_config: Any = None,
    later: bool = False,
) -> Languages:
    """The `Languages` of a decode of ``tokenizer`` (the run's vocabulary).

    A multilingual vocabulary (`language_pair.has_codes`) takes ``source_lang`` and ``target_lang``,
    each defaulting to the pair ``data_config`` records (`recorded_pair`); any other takes
    ``source_tag`` alone (`tag_sources`). ``later``: the pair may still come (the Python API's
    load, whose calls may name it): a multilingual vocabulary without one gives the vocabulary
    as it is, no ids forced; a code given is still checked.

    Raises:
      DataError: one line, for a multilingual vocabulary without a pair, a code it lacks, or
        ``source_tag`` given to it; for a code given to a vocabulary without codes.
    """
    pair = zip(FLAGS, (source_lang, target_lang), strict=True)
    if not has_codes(tokenizer):
        return _bilingual(tokenizer, [(f, c) for f, c in pair if c], source_tag, later)
    codes = list(tokenizer.language_tokens())
    if source_tag is not None:
        raise DataError(
            f'--source_tag={source_tag!r}: this run is multilingual ({few_codes(codes)}): pass '
            '--source_lang and --target_lang instead.'
        )
    recorded = recorded_pair(data_config)
    keys = [
        f if given else f'data.{r}'
        for f, r, given in zip(FLAGS, RECORDED, (source_lang, target_lang), strict=True)
    ]
    source_lang, target_lang = source_lang or recorded[0], target_lang or recorded[1]
    for key, code in zip(keys, (source_lang, target_lang), strict=True):
        if code:  # an unknown code: one line naming a few, and the setting that gave it
            tokenizer.language_id(code, key)
    if not (source_lang and target_lang):
        if later:
            return Languages(tokenizer)
        raise DataError(
            f'this run is multilingual ({few_codes(codes)}): pass --source_lang and --target_lang.'
        )
    prefixes = tokenizer.prefixes(source_lang, target_lang)
    (source,) = prefixes.source  # one code before the source
    tagged = SourceTagged(tokenizer, tokenizer.id_to_piece(source), source)
    return Languages(tagged, tuple(prefixes.target), (source_lang, target_lang))
