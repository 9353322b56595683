"""The CTranslate2 export of converted T5 runs (transformer/commands/ctranslate2_t5.py), on the
runs of tests/t5_dirs.py:

* its model.bin holds what CTranslate2's own T5 converter (``T5Loader``) writes of the same
  Hugging Face model, variable for variable, but where that converter is wrong or writes the
  same thing in another type (the test's docstring);
* CTranslate2's scores of our export are ours, its greedy and beam-4 outputs ours (each
  difference of beam search explained by the two searches' rules).

CTranslate2 runs only in processes of its own (tests/ctranslate2_child.py, and its converter in
a subprocess); this process never imports it.
"""

import numpy as np
import pytest

from tests.ctranslate2_compare import (
    assert_scores_equal,
    assert_searches_equal,
    convert_in_child,
    read_model_bin,
)
from tests.shared_dirs import built_once
from tests.t5_dirs import eos_scaled, lines
from tests.tiny_run import run_dir_with
from transformer import decoding, export
from transformer.checkpoint import load_model
from transformer.commands import ctranslate2_spec
from transformer.formats import ExportError

pytest.importorskip(
    'ctranslate2', reason="ctranslate2 is not installed: pip install -e '.[export]'"
)
pytest.importorskip(
    'transformers', reason="transformers is not installed: pip install -e '.[export]'"
)

# CTranslate2's T5Loader over transformers' model with the head of its own (tests/t5_dirs.py
# hf_model: transformers 5 ties it whatever the config says), of each (directory, out) pair
# of the arguments.
_CONVERT = (
    'import os, pathlib, sys\n'
    'import transformers\n'
    'from ctranslate2.converters.transformers import T5Loader\n'
    'from tests.t5_dirs import hf_model\n'
    'for source, out in zip(sys.argv[1::2], sys.argv[2::2]):\n'
    '    model = hf_model(pathlib.Path(source))\n'
    '    tokenizer = transformers.T5Tokenizer.from_pretrained(source)\n'
    '    loader = T5Loader()\n'
    '    spec = loader.get_model_spec(model)\n'
    '    loader.set_config(spec.config, model, tokenizer)\n'
    '    loader.set_vocabulary(spec, loader.get_vocabulary(model, tokenizer))\n'
    '    spec.validate(); spec.optimize(None); os.makedirs(out); spec.save(out)\n'
)
CONVERTED = ('v1.1', 'v1.0')


@pytest.fixture(scope='module')
def their_exports(t5_hf_dirs, tmp_path_factory):
    """DIR/<name>: CTranslate2's conversion of each of `CONVERTED`, in one process (it imports
    torch, transformers and ctranslate2 once for both), once for all workers; read them only."""

    def convert(path):
        pairs = [str(arg) for name in CONVERTED for arg in (t5_hf_dirs / name, path / name)]
        convert_in_child(_CONVERT, pairs)

    return built_once(tmp_path_factory, 'ctranslate2-t5-converted', convert)


def _export(run, out):
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={run}', f'--out={out}', '--format=ctranslate2'])
    assert info.value.code is None, info.value.code


@pytest.mark.slow  # an export and a conversion by CTranslate2 (torch, transformers)
@pytest.mark.parametrize('name', CONVERTED)
def test_the_export_holds_what_ctranslate2s_t5_converter_writes(
    t5_hf_dirs, t5_runs, their_exports, name, tmp_path
):
    """Every variable and alias of CTranslate2's conversion, equal, but: (1) ``head_dim`` on
    every attention, which ours writes and the converter does not (it never reads ``d_kv``,
    so its model of d_kv 6 != d_model / heads 8 has the wrong head size); (2) the stacks'
    ``scale_embeddings``, ours the float 1.0, the converter's False (int8 0): no scale both;
    (3) the decoder's ``scale_outputs`` of v1.1, which the converter writes from
    transformers 5's ``tie_word_embeddings`` (true whatever config.json says) though the head
    is its own, and ours does not; (4) v1.0's zero ReLU biases, which our tree holds. Ours
    holds the run's spiece.model besides."""
    ours, theirs = tmp_path / 'ours', their_exports / name
    _export(t5_runs / name, ours)
    (mine, my_aliases), (their, their_aliases) = (
        read_model_bin(d / 'model.bin') for d in (ours, theirs)
    )
    extra = {k for k in set(mine) | set(my_aliases) if k not in their and k not in their_aliases}
    extra = {k for k in extra if not k.endswith('/head_dim')}
    assert {k: v for k, v in my_aliases.items() if k not in extra} == their_aliases
    assert 'encoder/layer_1/self_attention/relative_attention_bias' in my_aliases
    if name == 'v1.0':
        assert extra and all(k.endswith('/bias') for k in extra)
        assert not any(mine[k].any() for k in extra if k in mine)
    else:
        assert not extra
    assert set(their) - set(mine) == ({'decoder/scale_outputs'} if name == 'v1.1' else set())
    assert all(mine[k] == 6 for k in mine if k.endswith('/head_dim'))
    # The run's SentencePiece model, to tokenize for it.
    assert (ours / 'spiece.model').read_bytes() == (t5_hf_dirs / name / 'spiece.model').read_bytes()
    for key, value in their.items():
        if key.endswith('scale_embeddings'):
            assert mine[key] == 1.0 and value == 0
        elif key in mine:
            np.testing.assert_array_equal(mine[key], value, err_msg=key)


# CTranslate2 ends no output before its first token (with min_decoding_length 0 too: the
# greedy comparison failed so without the constraint); ours is held to the same.
FIRST_TOKEN_NOT_EOS = decoding.Constraints(min_length=1)
LIMIT = 16
# Our searches as CTranslate2's (tests/ctranslate2_compare.py): length^1, log-probabilities
# over the tokens allowed, an output at the limit ending there.
OPTIONS = dict(alpha=1.0, length_penalty='fairseq', eos_at_limit='none', renormalize=True)
CT2_OPTIONS = dict(
    length_penalty=1.0,
    min_decoding_length=1,
    max_decoding_length=LIMIT,
    suppress_sequences=[['<pad>']],  # ours never emits padding
    return_end_token=True,
)


@pytest.mark.slow  # a converted run exported and decoded by both
@pytest.mark.parametrize(
    ('name', 'beam'),
    [('v1.1', True), ('v1.0', False), pytest.param('v1.0', True, marks=pytest.mark.long)],
)
def test_ctranslate2_scores_and_translates_our_t5_export_as_we_do(t5_runs, name, beam, tmp_path):
    """Of our export (relative buckets both ways in the encoder, causal in the decoder,
    unscaled logits, the gated tanh GELU or the tied rescaled head): CTranslate2's
    log-probability of each target token is ours to 1e-4 on a padded batch; its greedy
    outputs are our greedy search's tokens, </s> included; its beam-4 outputs are ours with
    their score (to 1e-4), or a lower one where ours ends a hypothesis CTranslate2 never
    offers </s> (tests/ctranslate2_compare.py). </s>'s output row is scaled (tests/t5_dirs.py
    `EOS_SCALE`) so that outputs end at different lengths.

    v1.0's beam search in the long tier: the v1.1 case runs the same search, and v1.0's
    network (the tied rescaled head, ReLU) is checked by its scores and greedy outputs."""
    config, tokenizer, model, params, _ = load_model(str(t5_runs / name))
    params = eos_scaled(params, name)
    directory = ctranslate2_spec.write_ctranslate2(
        str(tmp_path), model.config, config, tokenizer, params
    )
    eos = tokenizer.special.eos
    sources = [[*tokenizer.encode(line), eos] for line in lines(8, seed=5)]
    targets = [[*tokenizer.encode(line), eos] for line in lines(8, seed=6)]
    pieces = lambda ids: [tokenizer.id_to_piece(int(i)) for i in ids if i != 0]  # noqa: E731
    assert_scores_equal(directory, model, params, sources, targets, pieces, pad=0)
    options = decoding.DecodeOptions(LIMIT, max_decode_len=LIMIT, **OPTIONS)
    ours = assert_searches_equal(
        directory, model, params, sources, pieces, options, FIRST_TOKEN_NOT_EOS, beam, **CT2_OPTIONS
    )
    ended = sum(row[-1] == '</s>' for row in ours)
    assert 0 < ended < len(ours) and len({p for row in ours for p in row}) >= 4


def test_unscaled_logits_without_t5s_buckets_are_refused_in_one_line(tmp_path):
    """CTranslate2 takes ``queries_scale`` with a relative bias only (its T5 layout): another
    scale, or 1.0 with other positions, is refused naming the field, before anything is
    written."""
    workdir, _ = run_dir_with(tmp_path, attention_scale=1.0)
    out = tmp_path / 'out'
    with pytest.raises(ExportError) as info:
        export.export(str(workdir), str(out), format='ctranslate2')
    assert str(info.value) == (
        'model.attention_scale=1.0 cannot be exported as --format=ctranslate2: the CTranslate2 '
        'export writes the logits scale 1/sqrt(head_dim), or 1.0 with '
        "positions='t5_relative' (T5's) only."
    )
    assert not out.exists()
