"""A synthetic translation task: an invented language pair that needs no files and no network.

It exists for the offline quickstart and for tests. Everything (the lexicon and the sentences)
is a deterministic function of a seed, and every target is a deterministic function of its
source, so a small Transformer can learn the task to BLEU ~100; but it needs attention to do so
(word order changes, agreement looks at words far away), unlike a copy task.

Lexicon (drawn from the seed, with different sound patterns in the two languages so that no
word form is shared): 60 nouns, each with a target-side gender m / f / n that the source does
not show; 30 adjectives; 30 verbs; 10 adverbs; 8 prepositions; 3 conjunctions. Every source
lemma has exactly one target lemma: 205 source and 330 target word forms in all.

Source grammar (subject-verb-object, adjectives before the noun, no agreement)::

    sentence := clause (conj clause){0,2} '.'
    clause   := np verb [np] [prep np] [adv]
    np       := det adj{0,2} (noun | noun-s) | adj{0,2} noun-s    (no article: bare plural)
    det      := 'ze' (definite) | 'ka' (indefinite, singular) | 'sum' (indefinite, plural)
    noun-s   := noun + 's'                                    (plural)

Target grammar (verb-final, adjectives after the noun, agreement)::

    clause   := np [np] [prep np] [adv] verb                  (the verb moves to the end)
    np       := [det] noun adj{0,2}                           (adjectives follow the noun,
                                                               in the same order)
    det      := definite {m: 'lo', f: 'la', n: 'le', plural: 'li'}
              | indefinite {m: 'un', f: 'una', n: 'une', plural: 'uni'}
    noun     := stem (singular) | stem + {m: 'en', f: 'a', n: 'i'} (plural, by gender)
    adj      := stem + {m: 'o', f: 'a', n: 'e', plural: 'i'}  (agrees with its noun)
    verb     := stem + {singular: 'et', plural: 'unt'}       (agrees with the clause's
                                                               subject, several words away)

Conjunctions, prepositions, adverbs and the final '.' translate word for word. Sentences have
3..40 words (the same number on both sides; most have 5..20): 1, 2 or 3 clauses with
probabilities 0.55 / 0.3 / 0.15, each clause with an object (p 0.6), a prepositional phrase
(p 0.4) and an adverb (p 0.3), each noun phrase plural with p 0.35 and with 0 / 1 / 2
adjectives with p 0.6 / 0.3 / 0.1.

Example (seed 0; 'ka' indefinite, 'rastop zibid' adjectives, 'bland' a masculine noun, 'robop'
the verb, 'ze bland' the object, 'kesig ka fag' a prepositional phrase, 'koft' an adverb)::

    ka rastop zibid bland robop ze bland kesig ka fag koft .
    un munir shauwuno haisho lo munir shajar una waum shijosh qunaimet .

Splits: 'train', 'validation' and 'test', drawn from independent random streams of the seed;
the validation and test sets leave out every sentence that occurs in the training set, so they
measure generalisation to new sentences.
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import Any

from transformer.data.errors import DataError
from transformer.data.synthetic_lexicon import (
    ADJECTIVE_ENDING,
    NOUN_PLURAL,
    SOURCE_DETERMINERS,
    TARGET_DETERMINERS,
    VERB_ENDING,
    Lexicon,
    make_lexicon,
    pick,
)

SPLITS = ('train', 'validation', 'test')


def _noun_phrase(rng: random.Random, lex: Lexicon) -> tuple[list[str], list[str], bool]:
    """One noun phrase in both languages, and whether it is plural."""
    source_noun, target_noun, gender = pick(rng, lex.nouns)
    plural = rng.random() < 0.35
    if plural:
        kind = pick(rng, ('def', 'indef', 'bare'), (0.4, 0.3, 0.3))
    else:
        kind = pick(rng, ('def', 'indef'), (0.6, 0.4))
    num_adjectives = pick(rng, (0, 1, 2), (0.6, 0.3, 0.1))
    adjectives = [pick(rng, lex.adjectives) for _ in range(num_adjectives)]
    agreement = 'plural' if plural else gender

    source, target = [], []
    if kind != 'bare':
        source.append(SOURCE_DETERMINERS['indef_plural' if plural and kind == 'indef' else kind])
        target.append(TARGET_DETERMINERS[(kind, agreement)])
    source += [s for s, _ in adjectives]
    source.append(source_noun + 's' if plural else source_noun)
    target.append(target_noun + NOUN_PLURAL[gender] if plural else target_noun)
    target += [t + ADJECTIVE_ENDING[agreement] for _, t in adjectives]
    return source, target, plural


def _clause(rng: random.Random, lex: Lexicon) -> tuple[list[str], list[str]]:
    """One clause: S V [O] [P NP] [Adv] in the source, S [O] [P NP] [Adv] V in the target."""
    source, target, plural_subject = _noun_phrase(rng, lex)
    source_verb, target_verb = pick(rng, lex.verbs)
    source.append(source_verb)
    if rng.random() < 0.6:
        s, t, _ = _noun_phrase(rng, lex)
        source += s
        target += t
    if rng.random() < 0.4:
        s, t, _ = _noun_phrase(rng, lex)
        prep = pick(rng, lex.prepositions)
        source += [prep[0], *s]
        target += [prep[1], *t]
    if rng.random() < 0.3:
        adverb = pick(rng, lex.adverbs)
        source.append(adverb[0])
        target.append(adverb[1])
    target.append(target_verb + VERB_ENDING[plural_subject])
    return source, target


def _sentence(rng: random.Random, lex: Lexicon) -> tuple[str, str]:
    num_clauses = pick(rng, (1, 2, 3), (0.55, 0.3, 0.15))
    source, target = _clause(rng, lex)
    for _ in range(num_clauses - 1):
        conj = pick(rng, lex.conjunctions)
        s, t = _clause(rng, lex)
        source += [conj[0], *s]
        target += [conj[1], *t]
    return ' '.join([*source, '.']), ' '.join([*target, '.'])


# Sentences drawn in a row without one that fits before the generator gives up: the settings
# leave (almost) no sentence to draw, e.g. validation sentences not in a training set that
# already holds every short sentence there is.
_MAX_MISSES = 100_000


def _generate(seed: int, split: str, count: int, max_words: int, exclude: frozenset[str]):
    lex = make_lexicon(seed)
    rng = random.Random(f'{seed}/{split}')
    sources, targets, misses = [], [], 0
    while len(sources) < count:
        source, target = _sentence(rng, lex)
        if source.count(' ') + 1 > max_words or source in exclude:
            misses += 1
            if misses > _MAX_MISSES:
                raise DataError(
                    f'The synthetic {split} split cannot find {count} sentences of at most '
                    f'{max_words} words (data.synthetic.max_words) that are not in the training '
                    f'set (found {len(sources)}): raise data.synthetic.max_words or lower '
                    'data.synthetic.num_train.'
                )
            continue
        misses = 0
        sources.append(source)
        targets.append(target)
    return sources, targets


@functools.lru_cache(maxsize=16)
def _split_text(
    seed: int, split: str, count: int, max_words: int, num_train: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    exclude = frozenset()
    if split != 'train':
        exclude = frozenset(_split_text(seed, 'train', num_train, max_words, num_train)[0])
    sources, targets = _generate(seed, split, count, max_words, exclude)
    return tuple(sources), tuple(targets)


def translate(source: str, seed: int = 0) -> str:
    """The reference translation of a source sentence of the synthetic language.

    Parses the source with the grammar above and applies the target rules: the task's
    ground truth as a function, independent of how the sentences were generated.

    Args:
      source: a sentence of the source language (words separated by single spaces).
      seed: the seed of the lexicon.

    Returns:
      The target sentence.

    Raises:
      ValueError: if the sentence is not in the language.
    """
    lex = make_lexicon(seed)
    nouns = {s: (t, g) for s, t, g in lex.nouns}
    adjectives = dict(lex.adjectives)
    verbs = dict(lex.verbs)
    adverbs = dict(lex.adverbs)
    prepositions = dict(lex.prepositions)
    conjunctions = dict(lex.conjunctions)
    determiners = {v: k for k, v in SOURCE_DETERMINERS.items()}
    words = source.split(' ')
    if not words or words[-1] != '.':
        raise ValueError(f'Not a sentence of the synthetic language: {source!r}')
    words = words[:-1]
    pos = 0

    def noun_phrase():
        nonlocal pos
        kind = 'bare'
        if pos < len(words) and words[pos] in determiners:
            kind = determiners[words[pos]]
            pos += 1
        adjs = []
        while pos < len(words) and words[pos] in adjectives:
            adjs.append(adjectives[words[pos]])
            pos += 1
        if pos >= len(words):
            raise ValueError(f'Noun expected at the end of {source!r}')
        word = words[pos]
        plural = word not in nouns and word.endswith('s') and word[:-1] in nouns
        if word not in nouns and not plural:
            raise ValueError(f'Noun expected, got {word!r} in {source!r}')
        pos += 1
        stem, gender = nouns[word[:-1] if plural else word]
        agreement = 'plural' if plural else gender
        out = []
        if kind != 'bare':
            out.append(TARGET_DETERMINERS[('indef' if kind == 'indef_plural' else kind, agreement)])
        out.append(stem + NOUN_PLURAL[gender] if plural else stem)
        out += [a + ADJECTIVE_ENDING[agreement] for a in adjs]
        return out, plural

    def at_noun_phrase():
        return pos < len(words) and (
            words[pos] in determiners
            or words[pos] in adjectives
            or words[pos] in nouns
            or (words[pos].endswith('s') and words[pos][:-1] in nouns)
        )

    target = []
    while True:
        subject, plural = noun_phrase()
        if pos >= len(words) or words[pos] not in verbs:
            raise ValueError(f'Verb expected in {source!r}')
        verb = verbs[words[pos]] + VERB_ENDING[plural]
        pos += 1
        clause = subject
        if at_noun_phrase():
            clause += noun_phrase()[0]
        if pos < len(words) and words[pos] in prepositions:
            clause.append(prepositions[words[pos]])
            pos += 1
            clause += noun_phrase()[0]
        if pos < len(words) and words[pos] in adverbs:
            clause.append(adverbs[words[pos]])
            pos += 1
        target += [*clause, verb]
        if pos == len(words):
            break
        if words[pos] not in conjunctions:
            raise ValueError(f'Conjunction expected, got {words[pos]!r} in {source!r}')
        target.append(conjunctions[words[pos]])
        pos += 1
    return ' '.join([*target, '.'])


def vocabulary(seed: int = 0) -> tuple[list[str], list[str]]:
    """Every word form of the source and of the target language of ``seed``."""
    lex = make_lexicon(seed)
    source = list(SOURCE_DETERMINERS.values()) + ['.']
    target = list(TARGET_DETERMINERS.values()) + ['.']
    for s, t, g in lex.nouns:
        source += [s, s + 's']
        target += [t, t + NOUN_PLURAL[g]]
    for s, t in lex.adjectives:
        source.append(s)
        target += [t + e for e in ADJECTIVE_ENDING.values()]
    for s, t in lex.verbs:
        source.append(s)
        target += [t + e for e in VERB_ENDING.values()]
    for s, t in itertools.chain(lex.adverbs, lex.prepositions, lex.conjunctions):
        source.append(s)
        target.append(t)
    return source, target


# The ``data.synthetic`` section: (default, type, one-line description) of each key.
KEYS = {
    'synthetic.seed': (0, int, 'the lexicon and every sentence follow from it'),
    'synthetic.num_train': (10_000, int, 'sentence pairs of the train split'),
    'synthetic.num_validation': (500, int, 'sentence pairs of the validation split'),
    'synthetic.num_test': (500, int, 'sentence pairs of the test split'),
    'synthetic.max_words': (40, int, "longest sentence, in words, '.' included"),
}


# The shortest sentence of the grammar: a bare plural, a verb and '.'.
MIN_WORDS = 3
# The most sentences a split may ask for: drawn at ~5 x 10^4 a second on one core and held
# as Python strings, 10^8 pairs take over half an hour and tens of GB.
MAX_SENTENCES = 10**8


def check(data_config: Any) -> None:
    """The config's splits and the ``data.synthetic`` keys: integers that the generator can
    meet (it would draw forever for sentences shorter than `MIN_WORDS`)."""
    for key in ('train_split', 'eval_split', 'test_split'):
        check_split(data_config, getattr(data_config, key), f'data.{key}')
    cfg = data_config.synthetic
    if not hasattr(cfg, 'get'):
        raise DataError(
            f'data.synthetic={cfg!r:.60} must be a section of keys (seed, num_train, ...).'
        )
    least = {'num_train': 1, 'num_validation': 1, 'num_test': 1, 'max_words': MIN_WORDS}
    for name, low in {'seed': 0, **least}.items():
        value = cfg.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DataError(f'data.synthetic.{name}={value!r} must be >= {low}.')
        if name.startswith('num_') and value > MAX_SENTENCES:
            raise DataError(
                f'data.synthetic.{name}={value} must be <= {MAX_SENTENCES:_} (a split is drawn '
                'and held in memory whole).'
            )


def check_split(data_config: Any, split: str, key: str = 'split') -> None:
    if split not in SPLITS:
        raise DataError(
            f'The synthetic dataset has no split {split!r} ({key}); splits: {list(SPLITS)}.'
        )


def read(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of 'train', 'validation' or 'test': aligned lists of
    whitespace-separated sentences (``data.source_lang`` / ``target_lang`` are ignored)."""
    check_split(data_config, split)
    cfg = data_config.synthetic
    count = {'train': cfg.num_train, 'validation': cfg.num_validation, 'test': cfg.num_test}
    sources, targets = _split_text(
        int(cfg.seed), split, int(count[split]), int(cfg.max_words), int(cfg.num_train)
    )
    return list(sources), list(targets)


def identity(data_config: Any, split: str) -> dict[str, Any]:
    return {'synthetic': data_config.synthetic.to_dict()}
