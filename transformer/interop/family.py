"""What a pretrained family provides (`Family`), what its reader gives back (`Pretrained`), and
its errors (`PretrainedError`): the interface every family module (marian.py, ...) fills in
and every caller (convert, ``train.init_from``, export, the run directory's vocabulary)
reads, so that none of them names a family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer.formats import Format


class PretrainedError(RuntimeError):
    """A pretrained directory this project cannot read as asked; one line naming the file or
    key."""


@dataclasses.dataclass
class Pretrained:
    """A pretrained directory read into this project's terms."""

    family: str  # `Family.name` of the family that read it
    directory: str
    model: dict[str, Any]  # the config's model section
    eval: dict[str, Any]  # the eval settings its own generation applies
    generation: dict[str, tuple[Any, str]]  # the generation settings: value, where it came from
    languages: tuple[str | None, str | None]  # its source and target language, where named
    tokenizer: Any  # its vocabulary, with this project's ids (`Family.owns_vocabulary`)
    params: dict[str, Any] | None  # None until read with weights=True
    # Its config files as read ({name: JSON object, or None without that file}): the export of
    # its converted run writes them back.
    files: dict[str, dict[str, Any] | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Family:
    """One pretrained family: everything this project does with its directories.

    Attributes:
      name: its name in converted_from.json and the messages ('marian').
      title: what the messages call its models ('MarianMT').
      model_types: the config.json ``model_type`` values it reads.
      recognises: (directory) -> whether it is a directory of this family (config.json's
        ``model_type``, its files); never raises.
      load: (directory, weights=True) -> `Pretrained`; a one-line `PretrainedError` for a
        directory it cannot read, raised before anything is written.
      owns_vocabulary: (vocabulary) -> whether a loaded vocabulary is its own (one family's
        each: encode, decode, id_to_piece, token_id, language_tokens, vocab_size, fingerprint,
        copy_to; this project's ids).
      holds_vocabulary: (directory) -> whether a run's vocabulary directory holds its
        vocabulary (files only it has: no two families hold one directory).
      load_vocabulary: (directory, key=None, data_config=None, never_emit=()) -> its
        vocabulary, with ``never_emit`` (our ids) never output besides pad (a run's record,
        ``data.never_emit``); a one-line ``data.DataError`` for files that do not load.
      write_vocabulary: (vocabulary, added, directory) -> None: its files with the tokens
        ``added`` ([(name, like or None)]) at the end, into an existing empty ``directory``.
      tokenizer_files: (vocabulary) -> {file name: path} of the SentencePiece models a
        CTranslate2 directory of it holds (source.spm, target.spm).
      writes: what its export writes of a model (transformer/formats.py).
      write: (directory, cfg, run_config, tokenizer, params, source, length_exponent) ->
        None: its directory (weights, configs, tokenizer files) of a run into an existing
        empty ``directory``; ``source``: a converted run's recorded config files (None: a run
        trained here); ``length_exponent``: the length penalty's exponent its generation
        divides by (decoding.length_power).
    """

    name: str
    title: str
    model_types: tuple[str, ...]
    recognises: Callable[[str], bool]
    load: Callable[..., Pretrained]
    owns_vocabulary: Callable[[Any], bool]
    holds_vocabulary: Callable[[str], bool]
    load_vocabulary: Callable[..., Any]
    write_vocabulary: Callable[[Any, list, str], None]
    tokenizer_files: Callable[[Any], dict[str, str]]
    writes: Format
    write: Callable[..., None]


def add_rows(params: dict[str, Any], likes: list[int | tuple[int, ...] | None]) -> dict[str, Any]:
    """``params`` with one new vocabulary row per entry of ``likes`` after the existing ones,
    in the embedding and the output bias (transformer/data/added_tokens.py `like_rows`): a copy
    of row ``like`` (our id), the mean of the rows of a tuple of ids (the language codes'), or
    the mean of all existing rows (None). Everything else is ``params`` as is."""
    if not likes:
        return params

    def grown(rows: Any) -> np.ndarray:
        rows = np.asarray(rows)

        def start(like: int | tuple[int, ...] | None) -> np.ndarray:
            if like is not None and not isinstance(like, tuple):
                return rows[like]
            of = rows if like is None else rows[list(like)]
            return of.mean(axis=0, dtype=np.float64).astype(rows.dtype)

        return np.concatenate([rows, np.stack([start(like) for like in likes])])

    out = dict(params)
    out['shared_embedding'] = {'embedding': grown(params['shared_embedding']['embedding'])}
    if 'logits_bias' in params:
        out['logits_bias'] = grown(params['logits_bias'])
    return out
