"""The input side of training: sources, vocabulary and batches.

- ``load_text``: raw parallel text of a split (TFDS translation datasets, Multi30k, a folder
  of text files, or the built-in synthetic task); failures raise ``DataError``.
- ``get_tokenizer``: the joint SentencePiece vocabulary (0 = pad, 1 = eos, 2 = unk).
- ``make_train_iterator``: packed, token-budget training batches with a resumable state.
- ``make_eval_batches`` / ``restore_order``: every example, sorted and bucketed, and back.
- ``default_config``: the ``data`` config section with its defaults.
"""

from transformer.data.batching import (
    TrainIterator,
    batch_examples,
    bucket_length,
    make_eval_batches,
    make_train_iterator,
    pack_examples,
    restore_order,
)
from transformer.data.config import default_config
from transformer.data.sources import DataError, load_text
from transformer.data.tokenized import TokenizedSplit, tokenize_split
from transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer, get_tokenizer

__all__ = [
    'EOS_ID',
    'PAD_ID',
    'UNK_ID',
    'DataError',
    'TokenizedSplit',
    'Tokenizer',
    'TrainIterator',
    'batch_examples',
    'bucket_length',
    'default_config',
    'get_tokenizer',
    'load_text',
    'make_eval_batches',
    'make_train_iterator',
    'pack_examples',
    'restore_order',
    'tokenize_split',
]
