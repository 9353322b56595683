"""The synthetic translation task: deterministic, a function of the source, not a copy task."""

import collections

import numpy as np
import pytest

from transformer import schema
from transformer.data import synthetic


def _config(**overrides):
    config = schema.default_config().data
    config.synthetic.num_train = 2000
    config.synthetic.num_validation = 300
    config.synthetic.num_test = 300
    config.synthetic.update(overrides)
    return config


@pytest.fixture(scope='module')
def splits():
    config = _config()
    return {split: synthetic.read(config, split) for split in synthetic.SPLITS}


def test_deterministic_from_seed():
    synthetic._split_text.cache_clear()
    synthetic.make_lexicon.cache_clear()
    first = synthetic.read(_config(), 'train')
    synthetic._split_text.cache_clear()
    synthetic.make_lexicon.cache_clear()
    assert synthetic.read(_config(), 'train') == first
    other = synthetic.read(_config(seed=1), 'train')
    assert other[0][:50] != first[0][:50]
    assert set(synthetic.vocabulary(1)[0]) != set(synthetic.vocabulary(0)[0])


def test_target_is_a_function_of_the_source(splits):
    translations = collections.defaultdict(set)
    for sources, targets in splits.values():
        for source, target in zip(sources, targets, strict=True):
            translations[source].add(target)
            # The grammar's rules, applied by a parser, give the generated target.
            assert synthetic.translate(source) == target
    assert all(len(t) == 1 for t in translations.values())


def test_lengths_and_vocabulary(splits):
    sources, targets = splits['train']
    lengths = np.array([len(s.split()) for s in sources])
    assert lengths.min() >= 3 and lengths.max() <= 40
    assert lengths.max() >= 30  # a tail of long sentences
    assert 0.7 < np.mean((lengths >= 5) & (lengths <= 20))
    assert [len(t.split()) for t in targets] == lengths.tolist()
    source_words, target_words = synthetic.vocabulary()
    assert 150 <= len(source_words) <= 400 and 150 <= len(target_words) <= 500
    assert not set(source_words) - {'.'} & set(target_words)  # no word is shared
    used = {w for s in sources for w in s.split()}
    assert used <= set(source_words)


def test_needs_reordering_and_agreement(splits):
    lex = synthetic.make_lexicon(0)
    source_verbs = {s for s, _ in lex.verbs}
    target_verbs = {t + ending for _, t in lex.verbs for ending in ('et', 'unt')}
    sources, targets = splits['train']
    assert all(s.split() != t.split() for s, t in zip(sources, targets, strict=True))
    # Verb-final target; the source verb comes earlier in most sentences.
    assert all(t.split()[-2] in target_verbs for t in targets)
    assert np.mean([s.split()[-2] in source_verbs for s in sources]) < 0.3
    # One source adjective has several target forms (agreement), so word lookup alone fails.
    source_adjective, target_adjective = lex.adjectives[0]
    forms = {w for t in targets for w in t.split() if w[:-1] == target_adjective}
    assert len(forms) >= 3
    # The verb agrees in number with the subject, several words before it.
    nouns = {s for s, _, _ in lex.nouns}
    for source, target in zip(sources, targets, strict=True):
        subject = next(w for w in source.split() if w in nouns or w[:-1] in nouns)
        verb = next(w for w in target.split() if w in target_verbs)
        assert verb.endswith('unt') == (subject not in nouns)


def test_evaluation_splits_are_new_sentences(splits):
    train = set(splits['train'][0])
    for split in ('validation', 'test'):
        sources, _ = splits[split]
        assert len(sources) == 300
        assert not train & set(sources)
    assert splits['validation'][0] != splits['test'][0]


def test_translate_rejects_other_text():
    with pytest.raises(ValueError):
        synthetic.translate('hello world .')
