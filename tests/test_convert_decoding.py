"""transformer.convert records the decoding settings Hugging Face's ``generate`` applies to the
MarianMT directory (its files', else transformers' defaults, always with Hugging Face's length
rule), prints them, and the converted run decodes as ``generate`` does with them."""

import contextlib
import io
import json
import os
import shutil

import numpy as np
import pytest

from tests.marian_dir import TRAINED_LINES, marian_dir, synthetic_lines
from tests.tiny_run import DECODE_BATCH
from transformer import api, convert

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

LINES = [s for s, _ in synthetic_lines()][:TRAINED_LINES]
HF_DEFAULT = "Hugging Face's default"
# Also recorded, and named by the printed line; their values are generate's own (`_hf_applied`).
NAMED_BY_THE_LINE = ('forced_eos_token_id', 'bad_words_ids', 'renormalize_logits')


def _opus_generation(directory):
    """generation_config.json as OPUS-MT's hold it: num_beams and max_length, no length_penalty."""
    path = directory / 'generation_config.json'
    generation = json.loads(path.read_text())
    del generation['length_penalty']
    path.write_text(json.dumps(generation))


def _legacy_config(directory):
    """No generation_config.json; config.json with the generation keys older OPUS-MT
    directories keep there (num_beams, max_length, bad_words_ids)."""
    path = directory / 'generation_config.json'
    generation = json.loads(path.read_text())
    os.remove(path)
    config = json.loads((directory / 'config.json').read_text())
    keys = ('num_beams', 'max_length', 'bad_words_ids')
    config.update({key: generation[key] for key in keys})
    (directory / 'config.json').write_text(json.dumps(config))


def _nothing(directory):
    """Neither file names a generation setting."""
    os.remove(directory / 'generation_config.json')


# variant -> (how the directory is edited, the recorded {key: (value, where from)}).
VARIANTS = {
    'opus_generation': (
        _opus_generation,
        {
            'num_beams': [4, 'generation_config.json'],
            'length_penalty': [1.0, HF_DEFAULT],
            'max_length': [512, 'generation_config.json'],
        },
    ),
    'legacy_config': (
        _legacy_config,
        {
            'num_beams': [4, 'config.json'],
            'length_penalty': [1.0, HF_DEFAULT],
            'max_length': [512, 'config.json'],
        },
    ),
    'nothing': (
        _nothing,
        {
            'num_beams': [1, HF_DEFAULT],
            'length_penalty': [1.0, HF_DEFAULT],
            'max_length': [20, HF_DEFAULT],
        },
    ),
}


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory)


@pytest.fixture(scope='module')
def variant_dirs(hf_dir, tmp_path_factory):
    """variant -> the fixture's MarianMT directory edited as `VARIANTS` says."""
    root = tmp_path_factory.mktemp('variants')
    dirs = {}
    for name, (edit, _) in VARIANTS.items():
        dirs[name] = root / name
        shutil.copytree(hf_dir, dirs[name])
        edit(dirs[name])
    return dirs


@pytest.fixture(scope='module')
def converted(variant_dirs, tmp_path_factory):
    """variant -> (its run directory, what the command printed)."""
    root, runs = tmp_path_factory.mktemp('converted'), {}
    for name, directory in variant_dirs.items():
        printed = io.StringIO()
        with pytest.raises(SystemExit) as info, contextlib.redirect_stdout(printed):
            convert.cli(['convert', f'--from_hf={directory}', f'--workdir={root / name}'])
        assert info.value.code is None, info.value.code
        runs[name] = (root / name, printed.getvalue().splitlines())
    return runs


def _hf_applied(directory) -> dict:
    """What generate applies to ``directory`` when called without generation arguments."""
    model = transformers.MarianMTModel.from_pretrained(directory)
    # The merge generate does first: the model's generation config, then transformers'
    # defaults for what it leaves unset.
    applied, _ = model._prepare_generation_config(None)
    keys = ('num_beams', 'length_penalty', 'max_length', *NAMED_BY_THE_LINE)
    return {k: getattr(applied, k) for k in keys}


@pytest.mark.parametrize('variant', VARIANTS)
def test_convert_records_and_prints_what_generate_applies(variant, variant_dirs, converted):
    run_dir, printed = converted[variant]
    expected = VARIANTS[variant][1]
    recorded = json.loads((run_dir / 'converted_from.json').read_text())['generation']
    assert _hf_applied(variant_dirs[variant]) == {k: v[0] for k, v in recorded.items()}
    assert {k: recorded.pop(k) for k in NAMED_BY_THE_LINE}['renormalize_logits'][0] is None
    assert recorded == expected
    ev = json.loads((run_dir / 'config.json').read_text())['eval']
    beams, penalty = expected['num_beams'][0], expected['length_penalty'][0]
    assert (ev['beam_size'], ev['alpha'], ev['length_penalty']) == (beams, penalty, 'fairseq')
    assert len(printed) == 2 and printed[1].startswith('Decoding settings recorded: '), printed
    line = printed[1]
    search = 'greedy' if beams == 1 else f'beam {beams}'
    assert f'{search} (num_beams from {expected["num_beams"][1]})' in line
    assert f"alpha 1.0 'fairseq', log P / length^1.0 (length_penalty from {HF_DEFAULT})" in line
    assert f'max_length {expected["max_length"][0]} from {expected["max_length"][1]}' in line
    for key in NAMED_BY_THE_LINE:
        assert f'{key}=' in line, line


@pytest.mark.parametrize(
    'key, value, message',
    [
        ('length_penalty', -0.5, 'length_penalty=-0.5 is not expressible'),
        ('num_beams', 0, 'num_beams=0 is not a positive whole number'),
    ],
)
def test_a_setting_with_no_equivalent_stops_in_one_line(hf_dir, tmp_path, key, value, message):
    copy = tmp_path / 'hf'
    shutil.copytree(hf_dir, copy)
    path = copy / 'generation_config.json'
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    out = tmp_path / 'run'
    with pytest.raises(SystemExit) as info:
        convert.cli(['convert', f'--from_hf={copy}', f'--workdir={out}'])
    error = info.value.code
    assert error.startswith(f'error: {path}: {message}'), error
    assert '\n' not in error and sorted(p.name for p in tmp_path.iterdir()) == ['hf']


def _generate(directory, **flags):
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        out = model.generate(**tokenizer(LINES, padding=True, return_tensors='pt'), **flags)
    return tokenizer, out


@pytest.mark.slow
def test_beam_outputs_and_scores_equal_generates_defaults(variant_dirs, converted):
    """OPUS-MT's generation_config.json (num_beams 4, max_length 512, no length_penalty): the
    run's own settings give generate's own outputs, and each best hypothesis' score (log P /
    length^1.0, length counting EOS) equals generate's sequences_scores.

    On the lines the model learned. Elsewhere the searches can still part in two ways that
    no setting records: generate stops an example by a heuristic (early_stopping=False: the
    best alive log-probability over its current length, not the longest length it could
    reach, so with length_penalty > 0 it may stop before a longer hypothesis would win) and
    only lets a hypothesis + EOS finish when it ranks among the K best of all 2K
    continuations kept; ours stops when no alive hypothesis can win at any length up to its
    limit and offers every hypothesis + EOS. And its limit is max_length (512, the start
    token counted) where ours is the input's length + eval.extra_length."""
    tokenizer, out = _generate(
        variant_dirs['opus_generation'], output_scores=True, return_dict_in_generate=True
    )
    theirs = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    run = api.load(converted['opus_generation'][0])
    best = [h[0] for h in run.translate(LINES, nbest=1, batch_size=DECODE_BATCH)]
    assert [h.text for h in best] == theirs
    ours = np.array([h.score for h in best])
    np.testing.assert_allclose(ours, out.sequences_scores.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_greedy_outputs_equal_generates_defaults(variant_dirs, converted):
    """Neither file names a setting: the run decodes greedily, as generate does, and the
    outputs are generate's wherever generate ended them itself. generate's default
    max_length (20) lets it write 20 tokens after the start token, the last a forced EOS:
    the run does not record it (it decodes up to the input's length + eval.extra_length), so
    an output generate cut there goes on in ours; each such output of generate's is a prefix
    of ours."""
    tokenizer, out = _generate(variant_dirs['nothing'])
    theirs = tokenizer.batch_decode(out, skip_special_tokens=True)
    ours = api.load(converted['nothing'][0]).translate(LINES, batch_size=DECODE_BATCH)
    limit = out.shape[1] - 1  # the tokens after the start token
    assert limit == 20
    cut = [(out[i] != tokenizer.pad_token_id).sum() == limit for i in range(len(LINES))]
    assert 0 < sum(cut) < len(LINES) // 4  # the test sees both kinds of output
    for line, (a, b, at_limit) in enumerate(zip(ours, theirs, cut, strict=True)):
        assert a.startswith(b) if at_limit else a == b, (line, a, b)
