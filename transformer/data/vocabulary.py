"""What every vocabulary offers: `Vocabulary`, the interface the joint SentencePiece
`Tokenizer` (tokenizer.py) and a pretrained family's vocabulary (marian_vocab.py's
`MarianVocabulary`) both satisfy, so that the pipeline, the searches and the commands never ask
which one they hold.

A vocabulary's special ids are a value of it, ``special`` (`SpecialIds`,
transformer/tokens.py): the joint tokenizer's are `JOINT` (transformer/tokens.py); a run
records its vocabulary's in config.json (`special_fields`) and reads them back from there
(`DataSection.special`), and a vocabulary whose ids disagree with its run's is refused
(`check_special`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from transformer.data.errors import DataError
from transformer.data.pretokenize import Side
from transformer.tokens import JOINT, SpecialIds

# config.json's record of a run's special ids: the ``data`` fields and the `SpecialIds`
# attribute each holds. ``never_emit`` is kept as comma-separated ids ('0').
SPECIAL_FIELDS = {
    'pad_id': 'pad',
    'eos_id': 'eos',
    'unk_id': 'unk',
    'decoder_start_id': 'decoder_start',
    'never_emit': 'never_emit',
}


@runtime_checkable
class Vocabulary(Protocol):
    """A vocabulary of both languages: text to ids and back, with its special ids.

    Attributes:
      special: its pad, eos, unk, the decoder's start and the ids never emitted.
      vocab_size: V, the number of ids (the special ones included).
      fingerprint: a hash of its files, part of the token-cache keys.
      pretokenize: the text it reads ('none': raw text; 'moses': Moses-tokenized).
    """

    special: SpecialIds
    fingerprint: str
    pretokenize: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, side: Side = 'source') -> list[int]:
        """Ids of ``text`` (raw), without EOS."""
        ...

    def encode_batch(self, texts: Sequence[str], side: Side = 'source') -> list[list[int]]:
        """Ids of many texts of one side, without EOS."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS, the special ids skipped."""
        ...

    def id_to_piece(self, i: int) -> str: ...

    def token_id(self, piece: str) -> int | None:
        """The id of ``piece`` (a reserved token, a language code), or None."""
        ...

    def language_tokens(self) -> list[str]:
        """Its target-language tokens (``>>xx<<``), in id order; [] for none."""
        ...

    def copy_to(self, directory: str | os.PathLike) -> None:
        """Copies its files into ``directory`` (a run's ``vocab/``); files there are kept."""
        ...


def special_fields(special: SpecialIds) -> dict[str, Any]:
    """The ``data`` fields that record ``special`` in config.json."""
    values = {key: getattr(special, name) for key, name in SPECIAL_FIELDS.items()}
    values['never_emit'] = ','.join(map(str, special.never_emit))
    return values


def special_of(data_config: Any) -> SpecialIds:
    """The `SpecialIds` a ``data`` section records (`special_fields`; a config written before
    them: `JOINT`'s, which its run used); `DataError` in one line for ids that cannot work."""
    joint = special_fields(JOINT)
    values = {name: getattr(data_config, key, joint[key]) for key, name in SPECIAL_FIELDS.items()}
    text = str(values['never_emit']).strip()
    try:
        values['never_emit'] = tuple(int(i) for i in text.split(',')) if text else ()
    except ValueError:
        raise DataError(
            f"data.never_emit={text!r} must be comma-separated ids, e.g. '0' or '0,7'."
        ) from None
    try:
        special = SpecialIds(**values)
    except ValueError as e:
        raise DataError(f'data: {e}') from None
    if special.largest() >= data_config.vocab_size:
        raise DataError(
            f'data.vocab_size={data_config.vocab_size} holds no id {special.largest()}, which '
            'data.pad_id ... data.never_emit name.'
        )
    return special


def check_special(theirs: SpecialIds, special: SpecialIds, where: str) -> None:
    """`DataError` in one line when a vocabulary's special ids (``theirs``; ``where`` names
    it) are not the run's (``special``, its config's): the model is trained, or was converted,
    with those."""
    if theirs != special:
        raise DataError(
            f'{where} has the special ids {_text(theirs)}, but the run records '
            f'{_text(special)} (data.pad_id ... data.never_emit): use the '
            "run's own vocabulary and settings, or a new --workdir."
        )


def _text(special: SpecialIds) -> str:
    return ' '.join(f'{key}={value}' for key, value in special_fields(special).items())
