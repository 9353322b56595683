"""generation_config.json's ``bad_words_ids``, ``forced_eos_token_id`` and
``renormalize_logits`` are honoured by the converted run's searches as Hugging Face's
``generate`` honours them (its own code is the reference)."""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

from tests.marian_dir import TRAINED_LINES, marian_dir, synthetic_lines
from transformer import api, convert

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

LINES = [s for s, _ in synthetic_lines()][:TRAINED_LINES][:12]
# Our searches decode `LINES` in one batch of 12 rows: one search compiled for each run, where
# tests/tiny_run.py's DECODE_BATCH (8) rows made two batches and compiled a search for each.
# Under 16 rows the batch does not shrink as lines finish, so it is one loop.
BATCH = len(LINES)


def _load(run):
    """The converted run, decoding on one device: the searches compared do not depend on how
    many share a batch, and one device's programs compile faster than the 8 host devices'
    (tests/compiles.py)."""
    return api.load(run, devices=jax.devices()[:1])


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return marian_dir(tmp_path_factory)


def _edited(hf_dir, root, **generation):
    """A copy of ``hf_dir`` whose generation_config.json has ``generation``'s values."""
    copy = root / 'hf'
    shutil.copytree(hf_dir, copy)
    path = copy / 'generation_config.json'
    path.write_text(json.dumps({**json.loads(path.read_text()), **generation}))
    return copy


def _convert(directory, workdir):
    with pytest.raises(SystemExit) as info:
        convert.cli(['convert', f'--from_hf={directory}', f'--workdir={workdir}'])
    return info.value.code


def _generate(directory, **flags):
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        out = model.generate(**tokenizer(LINES, padding=True, return_tensors='pt'), **flags)
    return tokenizer, out


@pytest.fixture(scope='module')
def banned(hf_dir, tmp_path_factory):
    """(the MarianMT directory whose bad_words_ids also bans the piece generate's greedy
    search writes most often on `LINES`, that piece's Marian id, its converted run).

    Its length_penalty is 0: banning a piece the model wants takes the outputs off the lines
    it learned, where generate's early-stopping heuristic (tests/test_convert_decoding.py)
    would end some beams before a longer hypothesis wins; without a length penalty the
    heuristic is exact, as our bound is."""
    tokenizer, out = _generate(hf_dir, num_beams=1)
    ids, counts = np.unique(out[:, 1:].numpy(), return_counts=True)
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    piece = max((c, i) for i, c in zip(ids, counts, strict=True) if i not in special)[1]
    root = tmp_path_factory.mktemp('banned')
    pad = tokenizer.pad_token_id
    directory = _edited(hf_dir, root, bad_words_ids=[[pad], [int(piece)]], length_penalty=0.0)
    assert _convert(directory, root / 'run') is None
    return directory, int(piece), root / 'run'


def test_bad_words_become_the_runs_never_emit_and_export_back(banned, tmp_path):
    directory, piece, run = banned
    data = json.loads((run / 'config.json').read_text())['data']
    vocabulary = _load(run).tokenizer
    ours = vocabulary.our_id(piece)
    assert data['never_emit'] == f'0,{ours}' and vocabulary.special.never_emit == (0, ours)
    from transformer import export

    out = tmp_path / 'hf'
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={run}', f'--out={out}', '--format=hf'])
    assert info.value.code is None, info.value.code
    written = json.loads((out / 'generation_config.json').read_text())['bad_words_ids']
    given = json.loads((directory / 'generation_config.json').read_text())['bad_words_ids']
    assert written == given


@pytest.mark.slow
def test_banned_words_are_never_emitted_and_greedy_equals_generate(banned):
    directory, piece, run = banned
    tokenizer, out = _generate(directory, num_beams=1)
    assert not (out == piece).any()
    theirs = tokenizer.batch_decode(out, skip_special_tokens=True)
    assert _load(run).translate(LINES, beam_size=1, batch_size=BATCH) == theirs


@pytest.mark.long
def test_banned_words_beam_equals_generate_or_finds_a_better_hypothesis(banned):
    """Beam 4: generate's output, or (where the ban takes a line off what the model learned)
    one of a higher score: generate lets a hypothesis + EOS finish only from the best 2K
    continuations it keeps, ours offers every one (docs/pretrained.md).

    Long tier: test_beam_scores_follow_renormalize_logits_as_generate runs this search on this
    run (its renormalize_logits=False case, `banned` itself) with these assertions."""
    directory, piece, run = banned
    tokenizer, out = _generate(directory, output_scores=True, return_dict_in_generate=True)
    assert not (out.sequences == piece).any()
    theirs = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    ours = [h[0] for h in _load(run).translate(LINES, nbest=1, batch_size=BATCH)]
    same = [a.text == b for a, b in zip(ours, theirs, strict=True)]
    assert sum(same) >= len(LINES) // 2, same
    for a, b, score, equal in zip(ours, theirs, out.sequences_scores.numpy(), same, strict=True):
        if equal:
            np.testing.assert_allclose(a.score, score, atol=1e-5, rtol=0)
        else:
            assert a.score > score + 1e-5, (a.text, b, a.score, score)


def test_a_sequence_of_bad_words_is_refused_with_nothing_written(hf_dir, tmp_path):
    directory = _edited(hf_dir, tmp_path, bad_words_ids=[[5], [7, 8]])
    error = _convert(directory, tmp_path / 'run')
    assert error.startswith(f'error: {directory / "generation_config.json"}: bad_words_ids '), error
    assert 'a sequence of 2 tokens' in error and '\n' not in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf']


def _our_search(run, max_length, beams):
    """Our search on `LINES` with the run's settings, limited as generate with
    ``max_length`` (the start token counted): at most ``max_length`` - 1 output tokens.
    Returns (best sequences [B, T] in Marian's ids, their scores [B]; None for greedy)."""
    from transformer import decoding

    loaded = _load(run)
    vocab, special = loaded.tokenizer, loaded.model.config.special
    rows = [ids + [special.eos] for ids in vocab.encode_batch(LINES)]
    inputs = np.full((len(rows), max(map(len, rows))), special.pad, np.int32)
    for i, ids in enumerate(rows):
        inputs[i, : len(ids)] = ids
    ev = loaded.config.eval
    options = dataclasses.replace(
        decoding.decode_options(ev), max_decode_len=max_length - 1, extra_length=max_length
    )
    if beams == 1:
        tokens = decoding.greedy_search(loaded.model, loaded.params, inputs, options=options)
        scores = None
    else:
        tokens, scores = decoding.beam_search(
            *(loaded.model, loaded.params, inputs), beam_size=beams, options=options
        )
        tokens, scores = tokens[:, 0], np.asarray(scores[:, 0])
    marian = np.vectorize(vocab.marian_id)(np.asarray(tokens))
    return marian, scores


MAX_LENGTH = 7  # the fixture's outputs are longer: most lines reach the limit


@pytest.fixture(scope='module')
def limited(hf_dir, tmp_path_factory):
    """forced -> (a MarianMT directory with max_length `MAX_LENGTH`, with or without
    forced_eos_token_id, length_penalty 0 (generate's early stop is then exact: see
    `banned`), its converted run)."""
    out = {}
    for forced in (True, False):
        root = tmp_path_factory.mktemp(f'forced-{forced}')
        directory = _edited(hf_dir, root, max_length=MAX_LENGTH, length_penalty=0.0)
        if not forced:
            for name in ('generation_config.json', 'config.json'):
                path = directory / name
                path.write_text(
                    json.dumps({**json.loads(path.read_text()), 'forced_eos_token_id': None})
                )
        assert _convert(directory, root / 'run') is None
        out[forced] = (directory, root / 'run')
    return out


@pytest.mark.slow
@pytest.mark.parametrize('forced', [True, False])
@pytest.mark.parametrize('beams', [1, 4])
def test_the_length_limit_follows_forced_eos_token_id_as_generate(limited, forced, beams):
    """With forced_eos_token_id the outputs end in EOS at max_length (its log-probability
    counted as 0 in beam scores, as generate's processor sets it); without, they end there
    without EOS. Tokens and beam scores equal generate's."""
    directory, run = limited[forced]
    ev = json.loads((run / 'config.json').read_text())['eval']
    assert ev['eos_at_limit'] == ('forced' if forced else 'none')
    flags = dict(num_beams=beams, output_scores=True, return_dict_in_generate=True)
    tokenizer, out = _generate(directory, **flags)
    theirs = out.sequences[:, 1:].numpy()
    assert theirs.shape[1] == MAX_LENGTH - 1
    at_limit = theirs[:, -1] != tokenizer.pad_token_id
    assert at_limit.sum() > len(LINES) // 2  # the test sees the limit
    assert (theirs[at_limit, -1] == tokenizer.eos_token_id).all() == forced
    ours, scores = _our_search(run, MAX_LENGTH, beams)
    np.testing.assert_array_equal(ours[:, : theirs.shape[1]], theirs)
    if scores is not None:
        np.testing.assert_allclose(scores, out.sequences_scores.numpy(), atol=1e-5, rtol=0)


@pytest.fixture(scope='module')
def renormalized(banned, tmp_path_factory):
    """renormalize_logits -> (a MarianMT directory, its converted run): False, `banned`'s own
    (generate's default); True, a copy of it that sets it."""
    root = tmp_path_factory.mktemp('renormalize-True')
    directory = _edited(banned[0], root, renormalize_logits=True)
    assert _convert(directory, root / 'run') is None
    return {False: (banned[0], banned[2]), True: (directory, root / 'run')}


@pytest.mark.slow
def test_beam_scores_follow_renormalize_logits_as_generate(renormalized, banned):
    """The banned piece is the one the model wants most, so renormalising after banning it
    changes the scores; ours equal generate's sequences_scores either way, or (where the ban
    takes a line off what the model learned) are higher (`banned`'s beam test)."""
    scores = {}
    for value, (directory, run) in renormalized.items():
        assert json.loads((run / 'config.json').read_text())['eval']['renormalize'] is value
        flags = dict(output_scores=True, return_dict_in_generate=True)
        tokenizer, out = _generate(directory, **flags)
        assert not (out.sequences == banned[1]).any()
        theirs = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
        ours = [h[0] for h in _load(run).translate(LINES, nbest=1, batch_size=BATCH)]
        same = [a.text == b for a, b in zip(ours, theirs, strict=True)]
        assert sum(same) >= len(LINES) // 2, same
        mine, hf = np.array([h.score for h in ours]), out.sequences_scores.numpy()
        np.testing.assert_allclose(mine[same], hf[same], atol=1e-5, rtol=0)
        assert (mine[~np.array(same)] > hf[~np.array(same)] + 1e-5).all()  # (`banned`'s reason)
        scores[value] = mine
    assert np.max(scores[True] - scores[False]) > 0.1
