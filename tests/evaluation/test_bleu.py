"""sacreBLEU, tokenized BLEU (lowercased, compound-split), chrF and chrF++."""

import pytest
import sacrebleu
from sacrebleu.metrics import CHRF

from transformer.evaluation import bleu


def test_sacrebleu_and_chrf_equal_sacrebleu_itself():
    """The reported cased sacreBLEU / chrF are sacrebleu's corpus scores of the same text."""
    hyps = ['Ein Mann fährt ein rotes Fahrrad.', 'Zwei Hunde spielen im Schnee.']
    refs = ['Ein Mann fährt auf einem roten Fahrrad.', 'Zwei Hunde spielen im Schnee.']
    scores = bleu.bleu_scores(hyps, refs, target_lang='de')
    assert scores['sacrebleu'] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert scores['chrf'] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert 'tok:13a' in scores['sacrebleu_signature']
    assert 0 < scores['sacrebleu'] < 100


def test_chrf_plus_plus_equals_sacrebleu_word_order_2():
    """chrF++ is sacrebleu's CHRF(word_order=2): the word n-grams it adds to chrF change the
    score when the words differ but their characters largely match."""
    hyps = ['Ein Mann fährt ein rotes Fahrrad.', 'Zwei Hunde spielen im Schnee.', 'Ja']
    refs = ['Ein Mann fährt auf einem roten Fahrrad.', 'Zwei Hunde spielen im Schnee.', 'Nein']
    scores = bleu.bleu_scores(hyps, refs, target_lang='de')
    want = CHRF(word_order=2).corpus_score(hyps, [refs]).score
    assert scores['chrf++'] == pytest.approx(want)
    assert abs(scores['chrf++'] - scores['chrf']) > 0.5
    assert 'nw:2' in scores['chrf++_signature'] and 'nw:0' in scores['chrf_signature']


def test_tokenized_bleu_lowercases_and_splits_compounds():
    """Lowercased tokenized BLEU ignores case; compound splitting turns a-b into three tokens,
    as tensor2tensor's get_ende_bleu.sh does (only the first hyphen of a-b-c, like its regex)."""
    assert bleu.split_compounds('Mann-Hund , x-y-z') == (
        'Mann ##AT##-##AT## Hund , x ##AT##-##AT## y-z'
    )
    hyps, refs = ['EIN MANN LÄUFT .'], ['ein Mann läuft.']
    cased = bleu.bleu_scores(hyps, refs, target_lang='de')
    lower = bleu.bleu_scores(hyps, refs, target_lang='de', lowercase_tokenized=True)
    assert lower['tokenized_bleu'] == pytest.approx(100.0)
    assert cased['tokenized_bleu'] < 50
    split = bleu.bleu_scores(
        ['ein Mann-Hund läuft schnell weg'],
        ['ein Mann-Hund läuft schnell weg'],
        target_lang='de',
        compound_split=True,
    )
    assert split['tokenized_bleu'] == pytest.approx(100.0)
    assert 'compound-split' in split['tokenized_bleu_convention']
