"""Corpus scores of detokenized hypotheses: sacreBLEU, tokenized BLEU, chrF and chrF++.

Two BLEU numbers are reported because they are not comparable (docs/decoding.md, "Which BLEU"):

- sacreBLEU on cased, detokenized text, with its signature: the comparable modern number.
- tokenized BLEU as the paper reported it: Moses-tokenized hypotheses and references
  (optionally lowercased and punctuation-normalised, as the Multi30k literature does), with
  tensor2tensor's compound splitting of hyphens ("##AT##-##AT##") for WMT14 EN-DE; then
  plain corpus BLEU on those tokens (what multi-bleu.perl computes).

chrF and chrF++ (chrF plus word unigrams and bigrams, sacreBLEU's `CHRF(word_order=2)`, the
score NLLB reports) are computed on the same detokenized text as sacreBLEU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

_COMPOUND = re.compile(r'(\S)-(\S)')


def split_compounds(text: str) -> str:
    """tensor2tensor's get_ende_bleu.sh: "a-b" -> "a ##AT##-##AT## b" (after tokenization)."""
    # One left-to-right pass, like the script's `s{(\S)-(\S)}{...}g`: in "a-b-c" only the
    # first hyphen is split, and the number must match the script's.
    return _COMPOUND.sub(r'\1 ##AT##-##AT## \2', text)


def moses_tokenize(
    lines: Sequence[str],
    lang: str,
    *,
    lowercase: bool = False,
    normalize_punctuation: bool = False,
    compound_split: bool = False,
) -> list[str]:
    """Moses tokenization (sacremoses), optionally lowercased, normalised, compound-split."""
    # Imported here: compiling sacremoses' patterns costs every process ~0.25 s at import.
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    normalizer = MosesPunctNormalizer(lang=lang) if normalize_punctuation else None
    out = []
    for line in lines:
        if lowercase:
            line = line.lower()
        if normalizer is not None:
            line = normalizer.normalize(line)
        line = tokenizer.tokenize(line, escape=False, return_str=True)
        out.append(split_compounds(line) if compound_split else line)
    return out


def bleu_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    target_lang: str,
    lowercase_tokenized: bool = False,
    compound_split: bool = False,
) -> dict[str, Any]:
    """sacreBLEU (cased, detokenized) + tokenized BLEU + chrF + chrF++ of detokenized hypotheses.

    Args:
      hypotheses: one detokenized hypothesis per reference.
      references: the raw references.
      target_lang: the language Moses tokenizes for.
      lowercase_tokenized: lowercase and punctuation-normalise before tokenizing (the
        Multi30k convention of the `*.lc.norm.tok.*` files).
      compound_split: tensor2tensor's hyphen splitting (the paper's WMT14 EN-DE number).

    Returns:
      A JSON-ready dict of scores and signatures.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} references.')
    sacre = BLEU(trg_lang=target_lang)
    sacre_score = sacre.corpus_score(list(hypotheses), [list(references)])
    chrf, chrf_pp = CHRF(), CHRF(word_order=2)
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    chrf_pp_score = chrf_pp.corpus_score(list(hypotheses), [list(references)])
    tok_options = dict(
        lowercase=lowercase_tokenized,
        normalize_punctuation=lowercase_tokenized,
        compound_split=compound_split,
    )
    tok_hyps = moses_tokenize(hypotheses, target_lang, **tok_options)
    tok_refs = moses_tokenize(references, target_lang, **tok_options)
    tokenized = BLEU(tokenize='none', force=True).corpus_score(tok_hyps, [tok_refs])
    description = 'moses' + ''.join(
        f'+{name}'
        for name, on in [('lc+norm', lowercase_tokenized), ('compound-split', compound_split)]
        if on
    )
    return {
        'sacrebleu': sacre_score.score,
        'sacrebleu_signature': str(sacre.get_signature()),
        'sacrebleu_detail': str(sacre_score),
        'tokenized_bleu': tokenized.score,
        'tokenized_bleu_convention': description,
        'tokenized_bleu_detail': str(tokenized),
        'chrf': chrf_score.score,
        'chrf_signature': str(chrf.get_signature()),
        'chrf++': chrf_pp_score.score,
        'chrf++_signature': str(chrf_pp.get_signature()),
        'num_sentences': len(hypotheses),
    }
