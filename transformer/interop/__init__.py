"""Pretrained model families (Hugging Face MarianMT / OPUS-MT, M2M100 / NLLB-200, mBART-50,
T5 / MADLAD-400): one module per family owns, for that family, recognising its directory,
mapping its config onto the ``model`` and ``eval`` sections, its vocabulary with this
project's ids, its parameters in both directions, its refusals and its export; a small
registry picks the family of a directory, a name or a vocabulary, so that no caller names one.

- family.py: `Family` (what a family provides), `Pretrained` (a directory read into this
  project's terms), `PretrainedError`, `add_rows` (the rows of tokens added to a vocabulary);
- families.py: the registry, `FAMILIES`, `family_of` (a directory; one line naming the known
  families for one nobody reads), `family_named`, `recognised`, `vocabulary_family`,
  `held_vocabulary`, `export_family`;
- marian.py (the MarianMT entry, `marian.FAMILY`): its directory and config; marian_params.py
  its tensors; marian_vocab.py its vocabulary (marian_vocab_files.py its files read);
  marian_added.py tokens added to it;
  marian_export.py its export;
- fairseq_vocab.py: NLLB-200's, M2M100's and mBART-50's vocabularies with transformers 5's
  ids (fairseq_vocab_files.py their files read, fairseq_backend.py the tokenizer transformers 5
  builds for NLLB-200 and mBART-50, fairseq_codes.py their language codes,
  fairseq_vocab_write.py their files written back with added tokens);
- fairseq.py (M2M100, NLLB-200's dense models and mBART: their directories read,
  `fairseq.read`), fairseq_config.py their config.json as the model section,
  fairseq_params.py their tensors both ways, fairseq_export.py their export;
- fairseq_family.py: their entries, `M2M100` ('m2m100': M2M100 and NLLB-200) and `MBART`
  ('mbart': mBART-50), each joining the model to its vocabulary;
- t5.py (the T5 entry, `t5.FAMILY`: T5, T5 v1.1, MADLAD-400): its directory and config;
  t5_params.py its tensors both ways; t5_vocab.py its vocabulary (spiece.model or
  tokenizer.json, ids as they are); t5_export.py its export;
- state_dict.py: a directory's weights files, whole or sharded, for every family;
  generation.py: its generation settings as ``generate`` applies them, and the ``eval``
  settings made of them.

A new family is a module that builds its `Family` and one entry in `FAMILIES`
(docs/pretrained.md, "Families").
"""

from transformer.interop.families import (
    DEFAULT_FAMILY,
    FAMILIES,
    UNRECORDED_FAMILY,
    export_family,
    family_named,
    family_of,
    held_vocabulary,
    known,
    recognised,
    vocabulary_family,
)
from transformer.interop.family import Family, Pretrained, PretrainedError, add_rows

__all__ = [
    'DEFAULT_FAMILY',
    'FAMILIES',
    'UNRECORDED_FAMILY',
    'Family',
    'Pretrained',
    'PretrainedError',
    'add_rows',
    'export_family',
    'family_named',
    'family_of',
    'held_vocabulary',
    'known',
    'recognised',
    'vocabulary_family',
]
