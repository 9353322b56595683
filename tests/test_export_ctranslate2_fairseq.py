"""The CTranslate2 export of NLLB-200, M2M100 and mBART-50 runs (transformer/commands/
ctranslate2_spec.py, ctranslate2_embeddings.py), on the converted runs of
tests/test_convert_fairseq.py:

* its model.bin holds what CTranslate2's own converter (``TransformersConverter``) writes of
  the same Hugging Face directory, tensor for tensor, and its vocabulary and special tokens;
* CTranslate2 translating our export, the source ``[src_code] X </s>`` and the target code as
  its ``target_prefix``, gives our outputs: teacher-forced log-probabilities, greedy search
  and beam 4 (each difference of beam search explained by the two searches' rules).

CTranslate2 runs only in processes of its own (tests/ctranslate2_child.py, and its converter
in a subprocess); this process never imports it.
"""

import json
import shutil

import jax
import numpy as np
import pytest

from tests.ctranslate2_compare import (
    assert_scores_equal,
    assert_searches_equal,
    convert_in_child,
    read_model_bin,
)
from tests.fairseq_dirs import lines
from tests.fairseq_models import MODELS
from tests.shared_dirs import built_once
from transformer import decoding, export
from transformer.checkpoint import load_model
from transformer.commands import ctranslate2_spec

# The Hugging Face directories and their converted fairseq_runs, built once per session.
pytest.importorskip(
    'ctranslate2', reason="ctranslate2 is not installed: pip install -e '.[export]'"
)

# What the hub's mBART-50 config.json holds beside transformers 5's keys, which CTranslate2
# 4.8's converter reads: transformers 5's MBartConfig has no ``normalize_before`` (the
# converter fails on a directory without it), and ``tokenizer_class`` decides its decoder
# start (</s> for mBART-50, the code itself for mBART-25).
HUB_KEYS = {
    'mbart50': dict(
        normalize_before=True, normalize_embedding=True, tokenizer_class='MBart50Tokenizer'
    )
}
# CTranslate2's converter of each (directory, out) pair of the arguments.
_CONVERT = (
    'import sys\n'
    'from ctranslate2.converters import TransformersConverter\n'
    'for source, out in zip(sys.argv[1::2], sys.argv[2::2]):\n'
    '    TransformersConverter(source).convert(out)\n'
)
CONVERTED = ('nllb', 'mbart50')


@pytest.fixture(scope='module')
def their_exports(fairseq_hf_dirs, tmp_path_factory):
    """DIR/<name>: CTranslate2's conversion of each of `CONVERTED` (its directory with
    `HUB_KEYS` added, DIR/<name>-hf), in one process (it imports torch, transformers and
    ctranslate2 once for both), once for all workers; read them only."""

    def convert(path):
        pairs = []
        for name in CONVERTED:
            source = path / f'{name}-hf'
            shutil.copytree(fairseq_hf_dirs / name, source)
            config = json.loads((source / 'config.json').read_text())
            (source / 'config.json').write_text(json.dumps({**config, **HUB_KEYS.get(name, {})}))
            pairs += [str(source), str(path / name)]
        convert_in_child(_CONVERT, pairs)

    return built_once(tmp_path_factory, 'ctranslate2-fairseq-converted', convert)


@pytest.mark.slow  # an export and a conversion by CTranslate2 (torch, transformers)
@pytest.mark.parametrize('name', CONVERTED)
def test_the_export_holds_what_ctranslate2s_converter_writes(
    fairseq_runs, their_exports, name, tmp_path
):
    """Every variable and alias of CTranslate2's own conversion of the Hugging Face directory
    the run was converted from, equal, but two values: fairseq's computed sinusoids, ours
    1024 rows (Hugging Face computes any row; the converter writes max_position_embeddings,
    64 here), equal to 2e-6 (jax's sin and torch's); and the rows past the tokenizer's ids,
    ours named fairseq's way (madeupword0000), the converter's madeupword0. (The M2M100
    directory of tests/test_convert_fairseq.py does not convert: the converter appends the
    8 madeup words its tokenizer declares to the vocabulary, past the model's rows, which
    counted none; the NLLB-200 directory is an M2M100 model too.)"""
    ours = tmp_path / 'ours'
    with pytest.raises(SystemExit) as info:
        export.cli(
            ['export', f'--workdir={fairseq_runs / name}', f'--out={ours}', '--format=ctranslate2']
        )
    assert info.value.code is None, info.value.code
    theirs = their_exports / name

    (mine, my_aliases), (their, their_aliases) = (
        read_model_bin(d / 'model.bin') for d in (ours, theirs)
    )
    assert sorted(mine) == sorted(their) and my_aliases == their_aliases
    for key, value in their.items():
        if key == 'decoder/position_encodings/encodings' and name == 'nllb':
            assert mine[key].shape == (1024, 16) and value.shape == (64, 16)
            np.testing.assert_allclose(mine[key][:64], value, atol=1e-5)
        else:
            np.testing.assert_array_equal(mine[key], value, err_msg=key)
    assert mine['decoder/scale_embeddings'] == (4.0 if name == 'nllb' else 1.0)
    assert ('encoder/layernorm_embedding/gamma' in mine) == (name == 'mbart50')

    vocabularies = [json.loads((d / 'shared_vocabulary.json').read_text()) for d in (ours, theirs)]
    rows = len(vocabularies[1])
    fillers = 2 if name == 'nllb' else 0  # NLLB-200's rows past its ids
    assert (
        len(vocabularies[0]) == rows
        and vocabularies[0][: rows - fillers] == (vocabularies[1][: rows - fillers])
    )
    assert vocabularies[0][rows - fillers :] == [f'madeupword{i:04d}' for i in range(fillers)]
    configs = [json.loads((d / 'config.json').read_text()) for d in (ours, theirs)]
    for key in ('decoder_start_token', 'eos_token', 'unk_token', 'add_source_bos'):
        assert configs[0][key] == configs[1][key], key
    assert configs[0]['decoder_start_token'] == '</s>'


LINES = 12
LIMIT = 40  # every output's length limit: its code, its tokens and </s>
# Our searches as CTranslate2's: the length penalty length^1 (CTranslate2 divides the sum
# of the log-probabilities after the prefix by the length, prefix and </s> counted; ours
# with renormalize counts the forced code at log-probability 0), log-probabilities taken
# over the tokens allowed (CTranslate2 masks before its softmax), and no </s> right after
# the code (CTranslate2 bans it from all but the best beam there; min_length 2 from all).
OPTIONS = dict(alpha=1.0, length_penalty='fairseq', eos_at_limit='none', renormalize=True)
CT2_OPTIONS = dict(
    length_penalty=1.0,
    min_decoding_length=2,
    max_decoding_length=LIMIT,
    suppress_sequences=[['<pad>']],  # ours never emits padding
    return_end_token=True,
)


# How far the decoder's closing norm's bias moves along </s>'s embedding (its unit vector):
# enough that some outputs of each random model end before the limit and some do not.
EOS_SHIFT = {'m2m100': 3.0, 'mbart50': 8.0}


@pytest.mark.slow  # a converted run decoded by both
# mBART-50's in the long tier: its files are what CTranslate2's own converter writes (above),
# and the search is the M2M100 run's.
@pytest.mark.parametrize('name', ['m2m100', pytest.param('mbart50', marks=pytest.mark.long)])
def test_ctranslate2_scores_and_translates_as_we_do(fairseq_runs, name, tmp_path):
    """CTranslate2's log-probability of each target token (the code first) is ours to 1e-4
    on a padded batch; its greedy outputs are ours; its beam-4 outputs are ours with their
    score (to 1e-4), or a lower one where ours ends a hypothesis CTranslate2 never offers
    </s> (tests/ctranslate2_compare.py). A random model's outputs rarely end; the decoder's
    closing norm's bias,
    moved along </s>'s embedding, makes them end at different lengths."""
    config, tokenizer, model, params, _ = load_model(str(fairseq_runs / name), None, None)
    params = jax.tree.map(np.asarray, params)
    special = tokenizer.special
    eos_row = params['shared_embedding']['embedding'][special.eos]
    shift = EOS_SHIFT[name] * eos_row / np.linalg.norm(eos_row)
    params['decoder_norm']['bias'] = params['decoder_norm']['bias'] + shift
    directory = ctranslate2_spec.write_ctranslate2(
        str(tmp_path), model.config, config, tokenizer, params
    )
    prefixes = tokenizer.prefixes(*MODELS[name][3])
    pairs = lines(LINES)
    sources = [[*prefixes.source, *tokenizer.encode(en), special.eos] for en, _ in pairs]
    targets = [[*prefixes.target, *tokenizer.encode(de), special.eos] for _, de in pairs]
    pieces = lambda ids: [tokenizer.id_to_piece(int(i)) for i in ids if i != special.pad]  # noqa: E731
    assert_scores_equal(directory, model, params, sources, targets, pieces, special.pad)

    code = tokenizer.id_to_piece(prefixes.target[0])
    options = decoding.DecodeOptions(LIMIT, max_decode_len=LIMIT, forced=prefixes.target, **OPTIONS)
    constraints = decoding.Constraints(min_length=2)
    prefix = dict(target_prefix=[[code]] * LINES)
    ours = assert_searches_equal(
        directory, model, params, sources, pieces, options, constraints, **prefix, **CT2_OPTIONS
    )
    ended = sum(out[-1] == '</s>' for out in ours)
    assert 0 < ended < LINES and all(out[0] == code for out in ours)
