"""The translate command: one output line per input line, whatever the input."""

import functools
import shutil

import jax
import numpy as np
import pytest

from transformer import data as data_lib
from transformer import rundir, translate
from transformer.backends import platform
from transformer.checkpoint import checkpoint_steps, load_model
from transformer.decoding import DecodeOptions, translation


@functools.partial(jax.jit, static_argnums=0)
def _log_softmax(model, params, inputs, targets):
    return jax.nn.log_softmax(model.apply({'params': params}, inputs, targets))


def _target_log_probs(model, params, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
    """[R, T] log P(y_t | y_<t, x) of each (source ids, target ids) pair's target tokens (0
    past its end), from one compiled forward pass of the pairs padded to one shape: the
    encoder masks the source's padding, and the causal decoder's real positions do not read
    the padded ones after them."""
    inputs = np.zeros((len(pairs), max(len(x) for x, _ in pairs)), np.int32)
    targets = np.zeros((len(pairs), max(len(y) for _, y in pairs)), np.int32)
    for row, (x, y) in enumerate(pairs):
        inputs[row, : len(x)], targets[row, : len(y)] = x, y
    log_probs = np.asarray(_log_softmax(model, params, inputs, targets))
    picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    return np.where(targets != 0, picked, 0.0)


def test_translate_keeps_blank_lines_and_survives_overlong_lines(run_dir, tmp_path):
    """`python -m transformer.translate`: one output line per input line, blank lines stay
    blank, an over-long line is cut (not crashed on), and a sentence translates the same
    alone as inside a batch."""
    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    lines = [sources[0], '', '   ', ' '.join(sources[:30]), sources[1]]
    infile, outfile = tmp_path / 'in.txt', tmp_path / 'out.txt'
    infile.write_text('\n'.join(lines) + '\n')
    argv = ['translate', f'--workdir={run_dir}', f'--input={infile}', f'--output={outfile}']
    with pytest.raises(SystemExit) as exit_info:
        translate.cli([*argv, '--beam_size=2', '--max_input_tokens=24'])
    assert not exit_info.value.code
    out = outfile.read_text().split('\n')
    assert len(out) == len(lines) + 1 and out[-1] == ''  # one line each, newline-terminated
    assert out[1] == '' and out[2] == ''
    _, tokenizer, model, params, _ = load_model(str(run_dir))
    alone = translation.translate_lines(
        [sources[1]],
        tokenizer,
        model,
        params,
        beam_size=2,
        options=DecodeOptions(),
        batch_size=4,
        max_input_tokens=24,
    )
    assert alone == [out[4]]


def test_fewer_lines_than_a_batch_decode_in_rows_sized_to_them(run_dir, monkeypatch):
    """On a CPU, lines that fit in one batch decode in the smallest power of two rows that
    holds them (one search loop, where a batch of 16 compiles two) and translate as in the
    padded batch; elsewhere the batch keeps its size (one shape for any number of lines)."""
    lines = [1, 2, 3, 5, 9, 16, 40]
    for backend, want in (('cpu', [1, 2, 4, 8, 16, 16, 16]), ('gpu', [16] * 7)):
        monkeypatch.setattr(platform.jax, 'default_backend', lambda b=backend: b)
        assert [translation.batch_rows(n, 16) for n in lines] == want
    monkeypatch.undo()
    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    _, tokenizer, model, params, _ = load_model(str(run_dir))
    rows, batch_examples = [], data_lib.batch_examples

    def recorded(*args):
        batches = batch_examples(*args)
        rows.extend(b['inputs'].shape[0] for b in batches)
        return batches

    monkeypatch.setattr(translation.data_lib, 'batch_examples', recorded)
    decode = functools.partial(
        translation.translate_lines,
        sources[:3],
        tokenizer,
        model,
        params,
        beam_size=1,
        options=DecodeOptions(),
        batch_size=16,
        max_input_tokens=32,
    )
    fitted = decode()
    monkeypatch.setattr(translation.backends, 'fitted_lone_batch', lambda: False)
    assert decode() == fitted
    assert rows == [4 if jax.default_backend() == 'cpu' else 16, 16]


@pytest.mark.slow
def test_nbest_scores_are_the_model_log_probs_and_rank_one_is_the_translation(run_dir, tmp_path):
    """--nbest K: K rows per line, best first (K = 2 of a beam of 3); log_prob is the
    teacher-forced log P(y|x) of the hypothesis (recomputed here with a full forward pass),
    score = log_prob / penalty, and rank 1 is the plain translation with the same beam. The
    API is called with the command's run, options and batch size, so the command's search is
    the program the API compiled, and its rows are the API's."""
    from transformer import decoding
    from transformer.commands import decoding_run

    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    loaded = decoding_run.load_run(str(run_dir))
    tokenizer, model, params = loaded.tokenizer, loaded.model, loaded.params
    kwargs = dict(
        options=loaded.options(None, None),
        batch_size=loaded.config.eval.batch_size,
        max_input_tokens=32,
        layout=loaded.layout,
    )
    lines = [sources[2], '', sources[3]]
    nbest = translation.translate_lines(
        lines, tokenizer, model, params, beam_size=3, nbest=2, **kwargs
    )
    plain = translation.translate_lines(lines, tokenizer, model, params, beam_size=3, **kwargs)
    assert nbest[1] == [] and plain[1] == ''
    for line, hypotheses, best in zip(lines, nbest, plain, strict=True):
        if not line:
            continue
        assert 1 <= len(hypotheses) <= 2 and hypotheses[0].text == best
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
    found = [h for hypotheses in nbest for h in hypotheses]
    pairs = [
        ([*tokenizer.encode(line), 1], [*tokenizer.encode(h.text), 1])
        for line, hypotheses in zip(lines, nbest, strict=True)
        for h in hypotheses
    ]
    forward = _target_log_probs(model, params, pairs).sum(-1)  # every line's in one pass
    for h, log_prob, (_, target) in zip(found, forward, pairs, strict=True):
        np.testing.assert_allclose(h.log_prob, log_prob, rtol=1e-4, atol=1e-4)
        penalty = float(decoding.length_penalty(len(target), 0.6))
        np.testing.assert_allclose(h.score, h.log_prob / penalty, rtol=1e-5)

    infile, outfile = tmp_path / 'in.txt', tmp_path / 'out.tsv'
    infile.write_text('\n'.join(lines) + '\n')
    argv = ['translate', f'--workdir={run_dir}', f'--input={infile}', f'--output={outfile}']
    with pytest.raises(SystemExit) as exit_info:
        translate.cli([*argv, '--beam_size=3', '--nbest=2', '--max_input_tokens=32'])
    assert not exit_info.value.code
    rows = [row.split('\t') for row in outfile.read_text().splitlines()]
    assert all(len(row) == 5 for row in rows)
    assert [(r[0], r[1]) for r in rows] == [('0', '1'), ('0', '2'), ('2', '1'), ('2', '2')]
    assert float(rows[0][2]) >= float(rows[1][2])
    assert [(r[2], r[4]) for r in rows] == [(f'{h.score:.4f}', h.text) for h in found]


def test_translate_survives_hostile_stdin(run_dir, monkeypatch, capsys, caplog):
    """Seven hostile lines on stdin (invalid UTF-8, NUL and other controls, CRLF, blank,
    whitespace-only, far longer than max_len, no final newline): exit 0, exactly one output
    line each, and a warning naming each line that was changed."""
    import io
    import sys

    from tests.data.test_data_text import HOSTILE

    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    data = HOSTILE + b'\n' + ' '.join(sources[:40]).encode() + b'\r\nend'
    monkeypatch.setattr(sys, 'stdin', io.TextIOWrapper(io.BytesIO(data)))
    with pytest.raises(SystemExit) as exit_info:
        # absl flags outlive a cli() call in one process: reset what other tests set.
        translate.cli(
            ['translate', f'--workdir={run_dir}', '--beam_size=1', '--input=', '--output=']
            + ['--step=4']
        )
    assert not exit_info.value.code
    out = capsys.readouterr().out
    assert out.endswith('\n') and out.count('\n') == 9
    lines = out.split('\n')
    assert lines[1] == lines[2] == ''  # empty and whitespace-only lines stay empty
    warned = caplog.text
    for number in (4, 5, 6):
        assert f'stdin line {number}:' in warned
    assert 'Line 8 has' in warned  # the over-long line, cut to max_len tokens


@pytest.mark.long
def test_translate_ensemble_log_probs_are_the_mixtures(run_dir, tmp_path):
    """`translate --ensemble` with --nbest: the run at step 4 and the same run at step 2 (two
    different models) decode as one; every log_prob is the log of the two models' mean
    teacher-forced probability of the hypothesis, token by token.

    Long tier: its parts each keep a default-tier test: a mixture's beam scores
    (tests/decoding/test_decode.py::test_ensemble_scores_are_the_mixtures_log_probs), an
    ensemble on the commands' mesh (tests/decoding/test_mesh.py::
    test_an_ensemble_on_a_mesh_equals_one_device), ``--ensemble`` loaded and decoded by a
    command (tests/evaluation/test_evaluate.py::test_evaluate_ensemble_of_runs) and n-best
    log_probs as teacher-forced sums
    (`test_nbest_scores_are_the_model_log_probs_and_rank_one_is_the_translation`)."""
    sources, _ = data_lib.load_text(rundir.read_config(str(run_dir)).data, 'test')
    # The run's step 2 as a run of its own: copy everything but checkpoint 4.
    earlier = tmp_path / 'earlier'
    shutil.copytree(
        run_dir, earlier, ignore=lambda d, names: ['4'] if d.endswith('checkpoints') else []
    )
    assert checkpoint_steps(str(earlier)) == [2]
    infile, outfile = tmp_path / 'in.txt', tmp_path / 'out.tsv'
    infile.write_text(f'{sources[5]}\n{sources[6]}\n')
    argv = ['translate', f'--workdir={run_dir}', f'--input={infile}', f'--output={outfile}']
    with pytest.raises(SystemExit) as exit_info:
        translate.cli(
            [*argv, f'--ensemble={earlier}', '--average_last=1', '--beam_size=3']
            + ['--nbest=2', '--max_input_tokens=32']
        )
    assert not exit_info.value.code
    rows = [row.split('\t') for row in outfile.read_text().splitlines()]
    assert [(r[0], r[1]) for r in rows] == [('0', '1'), ('0', '2'), ('1', '1'), ('1', '2')]
    _, tokenizer, model, _, _ = load_model(str(run_dir))
    members = [load_model(str(run), average_last=1)[3] for run in (run_dir, earlier)]
    pairs = [
        ([*tokenizer.encode(sources[5 + int(index)]), 1], [*tokenizer.encode(text), 1])
        for index, _, _, _, text in rows
    ]
    per_member = np.stack([_target_log_probs(model, p, pairs) for p in members])  # [2, R, T]
    mixture = (jax.nn.logsumexp(per_member, axis=0) - np.log(2)).sum(-1)
    for (_, _, _, log_prob, _), expected, alone in zip(
        rows, mixture, per_member[0].sum(-1), strict=True
    ):
        np.testing.assert_allclose(float(log_prob), expected, rtol=1e-4, atol=1e-4)
        assert abs(alone - expected) > 1e-3  # the second model changes the numbers


def test_translate_out_of_memory_is_one_line_naming_batch_and_beam(run_dir, tmp_path, monkeypatch):
    """An out-of-memory error while decoding (jaxlib's wording, raised where the search
    runs) ends the command with one line that names --batch_size and --beam_size."""

    def out_of_memory(*args, **kwargs):
        raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 4294967296 bytes.')

    monkeypatch.setattr(translate, 'translate_lines', out_of_memory)
    infile = tmp_path / 'in.txt'
    infile.write_text('a b c\n')
    with pytest.raises(SystemExit) as exit_info:
        translate.cli(['translate', f'--workdir={run_dir}', f'--input={infile}'])
    assert exit_info.value.code == (
        'error: out of memory allocating 4294967296 bytes (4.0 GiB). Lower --batch_size '
        '(sentences decoded at once) or --beam_size.'
    )
