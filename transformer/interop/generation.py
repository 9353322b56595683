"""A Hugging Face directory's generation settings as ``generate`` applies them, and the run's
``eval`` settings made of them: what every family's conversion shares (marian.py, fairseq.py).

transformers 5 reads generation_config.json where the directory has one, and then nothing of
config.json's generation keys; without it, config.json's (`generation_settings`). A key the
file leaves unset takes transformers' default (`HF_DEFAULTS`).
"""

from __future__ import annotations

import os
from typing import Any

from transformer.interop.family import PretrainedError

CONFIG_FILE = 'config.json'
GENERATION_FILE = 'generation_config.json'
# What Hugging Face's generate applies to a setting a model's files leave unset (transformers'
# GenerationConfig defaults): greedy search, length_penalty 1.0 (its rule divides a beam's
# log-probability by length^1.0), at most 20 tokens, no token forced at that limit, no banned
# tokens, and beam scores not renormalised after banning tokens.
HF_DEFAULTS = {
    'num_beams': 1,
    'length_penalty': 1.0,
    'max_length': 20,
    'forced_eos_token_id': None,
    'bad_words_ids': None,
    'renormalize_logits': None,  # (generate renormalises only when it is true)
}
HF_DEFAULT = "Hugging Face's default"

Settings = dict[str, tuple[Any, str]]  # {key: (value, where it came from)}


def generation_settings(
    generation: dict[str, Any] | None,
    hf: dict[str, Any],
    defaults: dict[str, Any] = HF_DEFAULTS,
) -> Settings:
    """{key: (value, where it came from)} of ``defaults``' keys as Hugging Face's ``generate``
    applies them: from the directory's generation_config.json (``generation``) when there is
    one, and then none from config.json (transformers 5 loads only that file), else from
    config.json (``hf``: older directories keep num_beams and max_length there), and a key
    the file leaves unset takes ``defaults``' value."""
    keys, file = (generation, GENERATION_FILE) if generation is not None else (hf, CONFIG_FILE)
    return {
        key: (keys[key], file) if keys.get(key) is not None else (default, HF_DEFAULT)
        for key, default in defaults.items()
    }


def eval_settings(
    generation: Settings, directory: str, error: type[PretrainedError] = PretrainedError
) -> dict[str, Any]:
    """The ``eval`` settings of `generation_settings` (read from ``directory``): the beam
    size, the length penalty with Hugging Face's rule (a beam's log-probability divided
    by length^x: 'fairseq'), EOS at the length limit at probability 1 where
    ``forced_eos_token_id`` is set, else no EOS forced there (``eval.eos_at_limit`` 'forced'
    or 'none'), and ``renormalize_logits`` (``eval.renormalize``). The absolute max_length is
    not copied: this project decodes up to the input's length plus eval.extra_length.

    Raises:
      error: a value with no setting here, one line naming the file and the key.
    """
    (beams, beams_from), (penalty, penalty_from) = (
        generation['num_beams'],
        generation['length_penalty'],
    )
    if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
        raise error(
            f'{os.path.join(directory, beams_from)}: num_beams={beams!r} is not a positive '
            'whole number.'
        )
    if isinstance(penalty, bool) or not isinstance(penalty, int | float) or penalty < 0:
        raise error(
            f'{os.path.join(directory, penalty_from)}: length_penalty={penalty!r} is not '
            'expressible: eval.alpha is a number >= 0 (a negative one, which favours short '
            'outputs, has no setting here).'
        )
    renormalize, renormalize_from = generation['renormalize_logits']
    if renormalize is not None and not isinstance(renormalize, bool):
        raise error(
            f'{os.path.join(directory, renormalize_from)}: renormalize_logits={renormalize!r} '
            'is not true or false.'
        )
    forced = generation['forced_eos_token_id'][0] is not None  # (the family checks it is eos)
    return {
        'beam_size': beams,
        'alpha': float(penalty),
        'length_penalty': 'fairseq',
        'eos_at_limit': 'forced' if forced else 'none',
        'renormalize': renormalize is True,
    }


def single_token_bans(
    keys: dict[str, Any], size: int, eos: int, file: str, error: type[PretrainedError]
) -> list[int]:
    """The ids (the directory's own) of the single tokens ``bad_words_ids`` (of ``keys``, read
    from ``file``: the generation config ``generate`` reads) bans, as Hugging Face's
    ``NoBadWordsLogitsProcessor`` applies them: each at -inf at every step, except ``eos``,
    which it leaves out of the list.

    Raises:
      error: not a list of lists of ids below ``size``, or an entry of several tokens (a
        sequence the searches here cannot ban: they mask single ids).
    """
    entries = keys.get('bad_words_ids')
    if entries is None:
        return []
    banned = []
    for entry in entries if isinstance(entries, list) else [entries]:
        ids_ok = isinstance(entry, list) and all(type(i) is int and 0 <= i < size for i in entry)
        if not ids_ok or not entry:
            raise error(
                f'{file}: bad_words_ids={entries!r} is not a list of lists of ids below '
                f'vocab_size={size}.'
            )
        if len(entry) > 1:
            raise error(
                f'{file}: bad_words_ids holds {entry!r}, a sequence of {len(entry)} tokens: only '
                'single tokens can be banned here (the searches mask ids); drop the entry.'
            )
        if entry[0] != eos:
            banned.append(entry[0])
    return banned
