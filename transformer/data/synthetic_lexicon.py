"""The synthetic language pair's lexicon: invented word forms drawn from a seed, with distinct
sound patterns in the two languages (transformer/data/synthetic.py describes the grammar that
uses them)."""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar('T')

_NUM_NOUNS = 60
_NUM_ADJECTIVES = 30
_NUM_VERBS = 30
_NUM_ADVERBS = 10
_NUM_PREPOSITIONS = 8
_NUM_CONJUNCTIONS = 3
_GENDERS = ('m', 'f', 'n')

SOURCE_DETERMINERS = {'def': 'ze', 'indef': 'ka', 'indef_plural': 'sum'}
TARGET_DETERMINERS = {
    ('def', 'm'): 'lo',
    ('def', 'f'): 'la',
    ('def', 'n'): 'le',
    ('def', 'plural'): 'li',
    ('indef', 'm'): 'un',
    ('indef', 'f'): 'una',
    ('indef', 'n'): 'une',
    ('indef', 'plural'): 'uni',
}
NOUN_PLURAL = {'m': 'en', 'f': 'a', 'n': 'i'}
ADJECTIVE_ENDING = {'m': 'o', 'f': 'a', 'n': 'e', 'plural': 'i'}
VERB_ENDING = {False: 'et', True: 'unt'}  # keyed by "subject is plural"

# Distinct sound patterns keep the two languages apart (no shared word forms). Source words end
# in a vowel or one of these codas, never in 's', so a final 's' always marks a plural noun;
# target stems end in a consonant so that every inflected form is a different word.
_SOURCE_SOUNDS = (
    ('b', 'd', 'f', 'g', 'k', 'p', 'r', 's', 't', 'v', 'z', 'bl', 'dr', 'gr', 'st'),
    ('a', 'e', 'i', 'o', 'u'),
    ('', 'd', 'g', 'k', 'p', 'x', 'ft', 'nd'),
)
_TARGET_SOUNDS = (
    ('h', 'j', 'l', 'm', 'n', 'q', 'w', 'y', 'ch', 'sh', 'th'),
    ('a', 'e', 'i', 'o', 'u', 'ai', 'au'),
    ('l', 'm', 'n', 'r', 'sh'),
)


def pick(rng: random.Random, items: Sequence[T], weights: Sequence[float] | None = None) -> T:
    """One of ``items`` (uniform, or with ``weights``).

    Only ``Random.random()`` is used, whose stream Python keeps stable across versions, so a
    seed gives the same data everywhere.
    """
    u = rng.random()
    if weights is None:
        return items[int(u * len(items))]
    for item, weight in zip(items, weights, strict=True):
        if u < weight:
            return item
        u -= weight
    return items[-1]


@dataclasses.dataclass(frozen=True)
class Lexicon:
    """The word lists of one seed; entries are (source lemma, target lemma) pairs."""

    nouns: tuple[tuple[str, str, str], ...]  # (source, target stem, gender)
    adjectives: tuple[tuple[str, str], ...]
    verbs: tuple[tuple[str, str], ...]
    adverbs: tuple[tuple[str, str], ...]
    prepositions: tuple[tuple[str, str], ...]
    conjunctions: tuple[tuple[str, str], ...]


def _invent(
    rng: random.Random,
    count: int,
    sounds: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
    endings: tuple[str, ...],
    taken: set[str],
) -> list[str]:
    """``count`` new words of one or two syllables (onset + vowel) and a final coda.

    A word is accepted only if none of its forms (word + each ending) is already taken, so
    every inflected form of every word is unique in the joint vocabulary.
    """
    onsets, vowels, codas = sounds
    words = []
    while len(words) < count:
        syllables = [pick(rng, onsets) + pick(rng, vowels) for _ in range(pick(rng, (1, 2)))]
        word = ''.join(syllables) + pick(rng, codas)
        forms = {word + ending for ending in endings}
        if forms & taken:
            continue
        taken.update(forms)
        words.append(word)
    return words


@functools.lru_cache(maxsize=8)
def make_lexicon(seed: int) -> Lexicon:
    """The lexicon of ``seed`` (word lists and noun genders)."""
    rng = random.Random(f'{seed}/lexicon')
    taken = set(SOURCE_DETERMINERS.values()) | set(TARGET_DETERMINERS.values())

    def pairs(count, target_endings=('',), source_endings=('',)):
        source = _invent(rng, count, _SOURCE_SOUNDS, source_endings, taken)
        target = _invent(rng, count, _TARGET_SOUNDS, target_endings, taken)
        return tuple(zip(source, target, strict=True))

    noun_pairs = pairs(_NUM_NOUNS, ('', *NOUN_PLURAL.values()), source_endings=('', 's'))
    genders = [pick(rng, _GENDERS) for _ in range(_NUM_NOUNS)]
    return Lexicon(
        nouns=tuple((s, t, g) for (s, t), g in zip(noun_pairs, genders, strict=True)),
        adjectives=pairs(_NUM_ADJECTIVES, tuple(ADJECTIVE_ENDING.values())),
        verbs=pairs(_NUM_VERBS, tuple(VERB_ENDING.values())),
        adverbs=pairs(_NUM_ADVERBS),
        prepositions=pairs(_NUM_PREPOSITIONS),
        conjunctions=pairs(_NUM_CONJUNCTIONS),
    )
