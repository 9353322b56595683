"""The ``data`` config section with its defaults: the synthetic task, small and offline."""

from __future__ import annotations

import ml_collections

from transformer.data import sources


def default_config() -> ml_collections.ConfigDict:
    """A ``data`` ConfigDict with every key the pipeline reads (synthetic task, tiny vocab).

    Experiment configs override what they need, e.g. for WMT14 English -> German:
    ``dataset='wmt14_translate/de-en'``, ``test_split='test'``, ``vocab_size=37000``,
    ``vocab_sample_size=10_000_000``, ``max_len=256``.
    """
    config = ml_collections.ConfigDict()
    # 'synthetic' | 'multi30k' | 'folder' | a TFDS translation dataset ('wmt14_translate/de-en').
    config.dataset = 'synthetic'
    config.source_lang = 'en'  # language code keys of the TFDS examples / file suffixes
    config.target_lang = 'de'
    config.train_split = 'train'
    config.eval_split = 'validation'
    config.test_split = 'test'  # 'test2016' for multi30k
    # Joint SentencePiece vocabulary of both languages (Sec. 5.1: shared BPE of ~37000 for
    # EN-DE). Ids: 0 = pad, 1 = eos, 2 = unk, no bos. The model may end up smaller than
    # vocab_size when the training text has fewer distinct pieces (tiny data).
    config.vocab_size = 1000
    config.vocab_model_type = 'bpe'  # 'bpe' | 'unigram' | 'word' | 'char'
    # SentencePiece normalization, kept in the vocabulary and applied to every text it encodes:
    # 'nmt_nfkc' keeps the case; 'nmt_nfkc_cf' lowercases training text and inputs alike (the
    # model then writes lowercase, as systems trained on lowercased corpora do).
    config.vocab_normalization = 'nmt_nfkc'
    config.vocab_sample_size = 1_000_000  # sentences (both languages) sampled to train it
    config.vocab_path = ml_collections.config_dict.placeholder(str)  # None = workdir/vocab
    config.max_len = 64  # tokens per packed training row (source and target alike)
    # Training pairs longer than max_len (with EOS): 'drop' them or 'truncate' them (the cut
    # side keeps its EOS). Evaluation never drops or truncates.
    config.long_examples = 'drop'
    # Token-id cache; None = <workdir>/data_cache (no disk cache without a workdir).
    config.cache_dir = ml_collections.config_dict.placeholder(str)

    # Each source's own keys (data_dir, manual_dir, folder, synthetic.*): see its module.
    for module in (*sources.SOURCES.values(), sources.TFDS):
        module.add_config(config)
    return config
