"""Tiny NLLB-200, M2M100 and mBART-50 models built by transformers (every weight drawn)
beside the tokenizer directories of tests/fairseq_dirs.py, and those directories converted
into run directories: built once per test session for every worker (tests/shared_dirs.py;
read them only), and a folder dataset of English-German lines to fine-tune them on.
tests/conftest.py gives them to tests as the ``fairseq_hf_dirs``, ``fairseq_runs`` and
``lines_folder`` fixtures."""

from __future__ import annotations

import json
import pathlib
import shutil

from tests.cli import convert_cli
from tests.fairseq_dirs import fairseq_dirs, lines
from tests.shared_dirs import built_once
from transformer.interop.fairseq_vocab import FairseqVocabulary

# name: (tokenizer directory of tests/fairseq_dirs.py, Hugging Face classes, options, the
# pair its ids are built for, embedding rows past the tokenizer's ids).
MODELS = {
    'm2m100': (
        'm2m100',
        ('M2M100Config', 'M2M100ForConditionalGeneration', 'M2M100Tokenizer'),
        dict(activation_function='relu', scale_embedding=True),
        ('en', 'de'),
        0,
    ),
    'nllb': (
        'nllb',
        ('M2M100Config', 'M2M100ForConditionalGeneration', 'NllbTokenizer'),
        dict(activation_function='relu', scale_embedding=True),
        ('eng_Latn', 'deu_Latn'),
        2,  # as NLLB-200's 256206 rows for 256204 ids
    ),
    'mbart50': (
        'mbart50',
        ('MBartConfig', 'MBartForConditionalGeneration', 'MBart50Tokenizer'),
        dict(activation_function='gelu', scale_embedding=False),
        ('en_XX', 'de_DE'),
        0,
    ),
}
SHAPE = dict(
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
)


def build_models(path, tokenizers):
    """Each of `MODELS`: its tokenizer files and a Hugging Face model saved beside them,
    every weight drawn as tests/model/test_fairseq_families.py draws them."""
    import torch
    import transformers

    for name, (kind, classes, options, (src, tgt), extra) in MODELS.items():
        directory = path / name
        shutil.copytree(tokenizers / kind, directory)
        config_class, model_class, _ = classes
        rows = FairseqVocabulary(directory).size + extra
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(vocab_size=rows, **SHAPE, **options)
        model = getattr(transformers, model_class)(config).eval()
        with torch.no_grad():
            for key, tensor in [*model.named_parameters(), *model.named_buffers()]:
                if 'norm' in key:
                    tensor.normal_(1.0 if key.endswith('weight') else 0.0, 0.2)
                elif 'embed_positions' not in key or name == 'mbart50':
                    tensor.normal_(0.0, 0.5)
        model.save_pretrained(directory)
        config = json.loads((directory / 'tokenizer_config.json').read_text())
        config.update(src_lang=src, tgt_lang=tgt)
        (directory / 'tokenizer_config.json').write_text(json.dumps(config, indent=2))


def fairseq_models(tmp_path_factory) -> pathlib.Path:
    """DIR/<name> for each of `MODELS`: a Hugging Face model directory with its tokenizer."""
    tokenizers = fairseq_dirs(tmp_path_factory)
    return built_once(tmp_path_factory, 'fairseq-models', lambda p: build_models(p, tokenizers))


def fairseq_runs(tmp_path_factory) -> pathlib.Path:
    """DIR/<name> for each of `MODELS`: its model directory converted to a run directory."""
    models = fairseq_models(tmp_path_factory)

    def build(path):
        path.mkdir()
        for name in MODELS:
            message = convert_cli(f'--from_hf={models / name}', f'--workdir={path / name}')
            assert message is None, message

    return built_once(tmp_path_factory, 'fairseq-runs', build)


# NLLB-200-distilled-600M's config.json (the keys that set its shape).
NLLB_600M_CONFIG = {
    'model_type': 'm2m_100',
    'vocab_size': 256206,
    'd_model': 1024,
    'encoder_layers': 12,
    'decoder_layers': 12,
    'encoder_attention_heads': 16,
    'decoder_attention_heads': 16,
    'encoder_ffn_dim': 4096,
    'decoder_ffn_dim': 4096,
    'scale_embedding': True,
    'activation_function': 'relu',
}

TRAIN = 40  # training pairs of `lines_folder`


def lines_folder(tmp_path_factory) -> str:
    """A folder dataset of a few English-German lines: `TRAIN` to train on, 8 to validate and
    test (one evaluation batch: the final validation compiles one program, not one per
    shape)."""

    def write(path):
        path.mkdir()
        for split, pairs in (('train', lines(TRAIN)), ('validation', lines(8)), ('test', lines(8))):
            (path / f'{split}.en').write_text(''.join(s + '\n' for s, _ in pairs))
            (path / f'{split}.de').write_text(''.join(t + '\n' for _, t in pairs))

    return str(built_once(tmp_path_factory, 'fairseq-lines', write))
