"""The input side of training: sources, vocabulary and batches.

- ``load_text``: raw parallel text of a split, from the source ``data.dataset`` names
  (registry in sources.py: synthetic, multi30k, folder, none, any TFDS translation dataset);
  failures raise ``DataError``; ``order_note``: why a split cannot come in its original
  order (TFDS datasets stored shuffled), or None; ``check_split``: a split the source does
  not have, before anything is read.
- ``Vocabulary`` (vocabulary.py): what every vocabulary offers, its special ids (``special``,
  a `SpecialIds`) included; ``special_fields`` / ``special_of``: their record in the ``data``
  section of config.json; ``check_special``: a vocabulary that disagrees with its run.
- ``get_tokenizer``: the joint SentencePiece vocabulary (ids in transformer/tokens.py), which
  applies the run's pretokenization (``PRETOKENIZERS``; ``Pretokenizer``, pretokenize.py)
  both ways: raw text in, detokenized text out.
  A pretrained family's vocabulary (a MarianMT's) has the same interface and lives with its
  family (transformer/interop/).
- ``tag_sources``: a reserved token (a target-language token, a corpus tag) first in every
  source, as its id (source_tag.py); ``languages_of``: a multilingual run's language pair
  (``--source_lang`` / ``--target_lang``) as its source layout and forced first ids
  (languages.py).
- ``run_pair`` / ``LanguagePair`` (language_pair.py): a multilingual vocabulary's language
  codes on the training pairs (``data.source_lang_code``, a mix entry's PAIR); ``has_codes``,
  ``pair_forced``: the ids decoding forces first for them.
- ``prepare_token_stores`` / ``open_store`` / ``verify_token_store`` (token_store.py): a
  training split's token ids on disk, written by a streaming pass and memory-mapped (corpora
  larger than memory), checked in full where built and verified, quickly where opened; one
  store per corpus of ``data.mix`` (mix.py, mix_entries.py: several corpora, weighted and
  tagged, as one index space, `Corpora`; ``check_mix_files``, ``check_mix_vocabulary``).
- ``make_train_iterator`` (packing.py): packed training batches with a resumable state.
- ``make_eval_set`` / ``make_eval_batches`` / ``restore_order`` (eval_batches.py): every
  example, sorted and bucketed, with its references, and back in order.
"""

from transformer.data import added_tokens, mix_entries, sources
from transformer.data.errors import DataError
from transformer.data.eval_batches import (
    EvalSet,
    batch_examples,
    bucket_length,
    eval_set_of_lines,
    make_eval_batches,
    make_eval_set,
    restore_order,
)
from transformer.data.language_pair import LanguagePair, few_codes, has_codes
from transformer.data.language_pair import forced as pair_forced
from transformer.data.languages import Languages, languages_of
from transformer.data.mix import Corpora, run_pair
from transformer.data.mix import check_files as check_mix_files
from transformer.data.mix import check_vocabulary as check_mix_vocabulary
from transformer.data.mix import prepare_stores as prepare_token_stores
from transformer.data.packing import (
    LONG_EXAMPLES,
    TrainIterator,
    make_train_iterator,
    pack_examples,
)
from transformer.data.prefetch import Prefetcher
from transformer.data.pretokenize import PRETOKENIZERS, SIDES, Pretokenizer, Side
from transformer.data.source_tag import SourceTagged, tag_sources
from transformer.data.sources import check_split, load_text, order_note
from transformer.data.text import decode_lines
from transformer.data.token_store import TokenStore, open_store
from transformer.data.token_store import num_examples as token_store_pairs
from transformer.data.token_store import verify as verify_token_store
from transformer.data.tokenized import TokenizedSplit, tokenize_split
from transformer.data.tokenizer import MODEL_TYPES, NORMALIZATIONS, Tokenizer, get_tokenizer
from transformer.data.vocabulary import (
    SPECIAL_FIELDS,
    Vocabulary,
    check_special,
    special_fields,
    special_of,
)
from transformer.tokens import EOS_ID, JOINT, PAD_ID, UNK_ID, SpecialIds

__all__ = [
    'added_tokens',
    'LONG_EXAMPLES',
    'MODEL_TYPES',
    'NORMALIZATIONS',
    'PRETOKENIZERS',
    'SIDES',
    'Side',
    'Prefetcher',
    'SourceTagged',
    'Pretokenizer',
    'EOS_ID',
    'PAD_ID',
    'UNK_ID',
    'JOINT',
    'SPECIAL_FIELDS',
    'SpecialIds',
    'Vocabulary',
    'check_special',
    'special_fields',
    'special_of',
    'Corpora',
    'Languages',
    'DataError',
    'EvalSet',
    'TokenStore',
    'TokenizedSplit',
    'Tokenizer',
    'TrainIterator',
    'batch_examples',
    'check_split',
    'bucket_length',
    'check_mix_files',
    'check_mix_vocabulary',
    'has_codes',
    'few_codes',
    'LanguagePair',
    'pair_forced',
    'run_pair',
    'decode_lines',
    'eval_set_of_lines',
    'get_tokenizer',
    'languages_of',
    'load_text',
    'make_eval_batches',
    'make_eval_set',
    'make_train_iterator',
    'mix_entries',
    'open_store',
    'order_note',
    'pack_examples',
    'prepare_token_stores',
    'restore_order',
    'sources',
    'tag_sources',
    'token_store_pairs',
    'tokenize_split',
    'verify_token_store',
]
