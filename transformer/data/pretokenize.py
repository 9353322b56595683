"""Text before the vocabulary: raw (``'none'``) or the Moses pipeline of the Multi30k files.

The published text-only Transformer on Multi30k (Wu et al., ACL 2021, "Good for Misconceived
Reasons"; github.com/LividWo/Revisit-MMT, fairseq) trained on the dataset's
``*.lc.norm.tok.*`` files: Moses' lowercase.perl, normalize-punctuation.perl and
tokenizer.perl, in that order, the tokenizer XML-escaping (``&quot;``, ``&apos;``, ``&amp;``,
``&lt;``, ``&gt;``, ``&#124;``, ``&#91;``, ``&#93;``), then BPE. ``data.pretokenize='moses'``
runs the same steps through sacremoses before the SentencePiece model, each side with its own
language's rules, and undoes them on the way out: outputs are detokenized and unescaped
(MosesDetokenizer of the target language), never an XML entity.

Lowercasing has one switch, the vocabulary's normalization (``data.vocab_normalization``):
a vocabulary that case-folds ('nmt_nfkc_cf', 'nfkc_cf') has its text lowercased *before*
Moses, as the official order does; one that keeps the case gets cased Moses tokens. Moses'
rules depend on case (German 'Bart.' is a non-breaking prefix, 'bart.' is not): lowercasing
first reproduces the tokens of their train, validation and test2016 files on every line of
both languages, lowercasing after tokenizing (the vocabulary's fold alone) misses 74 training
lines and one test2016 line (benchmarks/multi30k_pretokenize.py; docs/data.md).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

PRETOKENIZERS = ('none', 'moses')
Side = Literal['source', 'target']
SIDES: tuple[str, ...] = get_args(Side)
# A control piece in a vocabulary trained on Moses-tokenized text: the vocabulary itself says
# which text it was trained on (SentencePiece never matches a control piece in the input).
MOSES_MARK = '<moses>'


# What sacremoses' ``perl_parity=True`` changes (normalize-punctuation.perl turns a lone '’'
# into '"'), set on each normalizer alone: sacremoses sets it on the class, which would change
# every normalizer of the process, tokenized BLEU's included.
_PERL_PARITY = {'’': '"', '\xa0«\xa0': ' "', '\xa0»\xa0': '" '}


@functools.cache
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer, MosesDetokenizer]:
    # Imported here: compiling sacremoses' patterns costs every process ~0.25 s at import.
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(lang=lang)
    normalizer.substitutions = [(p, _PERL_PARITY.get(p, s)) for p, s in normalizer.substitutions]
    return normalizer, MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)


class Pretokenizer:
    """Raw text <-> the text a vocabulary was trained on, for one language pair.

    Args:
      name: one of `PRETOKENIZERS`.
      source_lang: the source language code (Moses' rules for ``side='source'``).
      target_lang: the target language code (``side='target'`` and every output).
      lowercase: lowercase before Moses (the vocabulary case-folds).
    """

    def __init__(self, name: str, source_lang: str, target_lang: str, lowercase: bool):
        if name not in PRETOKENIZERS:
            raise ValueError(f'data.pretokenize must be one of {PRETOKENIZERS}, got {name!r}.')
        self.name = name
        self.languages = {'source': source_lang, 'target': target_lang}
        self.lowercase = lowercase

    def encode(self, text: str, side: Side = 'source') -> str:
        """The text the vocabulary reads: ``text`` itself, or lowercased (when the vocabulary
        case-folds), punctuation-normalised and Moses-tokenized with XML escaping, as the Perl
        scripts do (`_PERL_PARITY`, the newline below)."""
        if side not in SIDES:
            raise ValueError(f'side must be one of {SIDES}, got {side!r}.')
        if self.name == 'none':
            return text
        normalizer, tokenizer, _ = _moses(self.languages[side])
        if self.lowercase:
            text = text.lower()
        # The Perl script sees each line with its newline, which some rules read (German's
        # '."' -> '".' needs a character after the quote).
        normalised = normalizer.normalize(text + '\n')
        return tokenizer.tokenize(normalised, escape=True, return_str=True)

    def decode(self, text: str) -> str:
        """An output as text: Moses-detokenized and unescaped in the target language."""
        if self.name == 'none':
            return text
        _, _, detokenizer = _moses(self.languages['target'])
        return detokenizer.detokenize(text.split(), unescape=True)
