"""The score command and `api.Run.score` (transformer/decoding/scoring.py): the model's
teacher-forced log-likelihood of given pairs, batched or not, and the command's lines."""

import jax
import numpy as np
import pytest

from transformer import api, score
from transformer import data as data_lib
from transformer.decoding import length_penalty
from transformer.model import EOS_ID


@pytest.fixture(scope='module')
def loaded(run_dir):
    run = api.load(str(run_dir), step=4)
    sources, targets = data_lib.load_text(run.config.data, 'test')
    # Mixed lengths, an empty target and a blank source.
    pairs = [(sources[0], targets[0]), (sources[3], targets[5]), (sources[1], ''), ('', targets[2])]
    return run, [p[0] for p in pairs], [p[1] for p in pairs]


_logits = jax.jit(api.logits, static_argnums=0)  # one program per unpadded pair's shape


def independent_log_probs(run, source: str, target: str) -> np.ndarray:
    """Each target token's log-probability from `api.logits` on the unpadded pair."""
    inputs = np.array([run.tokenizer.encode(source, 'source') + [EOS_ID]], np.int32)
    targets = np.array([run.tokenizer.encode(target, 'target') + [EOS_ID]], np.int32)
    log_probs = jax.nn.log_softmax(_logits(run.model, run.params, inputs, targets))
    return np.take_along_axis(np.asarray(log_probs)[0], targets[0][:, None], -1)[:, 0]


@pytest.mark.slow
def test_scores_are_the_teacher_forced_log_likelihood_batched_or_not(loaded):
    """A padded batch of mixed lengths and one pair at a time both give, to 1e-5, each
    token's log-probability as `api.logits` computes it on the unpadded pair; the score is
    the sum over the run's length penalty of the count (EOS included); an empty target is
    scored on its EOS."""
    run, sources, targets = loaded
    batched = run.score(sources, targets, batch_size=8)
    alone = [run.score([s], [t], batch_size=1)[0] for s, t in zip(sources, targets, strict=True)]
    for found, single, source, target in zip(batched, alone, sources, targets, strict=True):
        expected = independent_log_probs(run, source, target)
        assert found.tokens == single.tokens == len(expected)
        np.testing.assert_allclose(found.token_log_probs, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(single.token_log_probs, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(found.log_prob, expected.sum(), rtol=1e-5, atol=1e-5)
        penalty = float(length_penalty(found.tokens, run.config.eval.alpha, 'gnmt'))
        np.testing.assert_allclose(found.score, found.log_prob / penalty, rtol=1e-6)
    assert batched[2].tokens == 1  # the empty target: EOS alone
    # The batch scored above again (its compiled program) under another rule.
    fairseq = run.score(sources, targets, batch_size=8, alpha=1.0, length_penalty='fairseq')[0]
    np.testing.assert_allclose(fairseq.score, fairseq.log_prob / fairseq.tokens, rtol=1e-6)


def test_the_score_command_writes_a_line_a_pair(loaded, run_dir, tmp_path, capsys):
    run, sources, targets = loaded
    source, target, out = tmp_path / 'src.txt', tmp_path / 'tgt.txt', tmp_path / 'out.txt'
    source.write_text(''.join(s + '\n' for s in sources))
    target.write_text(''.join(t + '\n' for t in targets))
    argv = ['score', f'--workdir={run_dir}', '--step=4', f'--source={source}']
    with pytest.raises(SystemExit) as info:
        score.cli([*argv, f'--target={target}', f'--output={out}', '--token_scores'])
    assert not info.value.code
    rows = [line.split('\t') for line in out.read_text().splitlines()]
    expected = run.score(sources, targets)
    assert len(rows) == len(sources)
    for row, pair in zip(rows, expected, strict=True):
        assert abs(float(row[0]) - pair.score) < 1e-5 and abs(float(row[1]) - pair.log_prob) < 1e-5
        assert int(row[2]) == pair.tokens == len(row[3].split())
        assert abs(sum(float(x) for x in row[3].split()) - pair.log_prob) < 1e-4
    target.write_text('one line\n')
    out.unlink()
    with pytest.raises(SystemExit) as info:
        score.cli([*argv, f'--target={target}', f'--output={out}'])
    assert info.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert err == (
        f'error: --target={target} has 1 lines and --source={source} {len(sources)}: '
        'give one target a source.'
    )


def test_api_refuses_unaligned_pairs_in_one_line(loaded):
    run, sources, targets = loaded
    with pytest.raises(ValueError, match=r'^2 targets for 3 sources: give one a source\.$'):
        run.score(sources[:3], targets[:2])


def test_the_workdir_must_exist(tmp_path, capsys):
    source = tmp_path / 'a.txt'
    source.write_text('x\n')
    argv = ['score', f'--workdir={tmp_path / "none"}', f'--source={source}', f'--target={source}']
    with pytest.raises(SystemExit) as info:
        score.cli(argv)
    assert str(info.value.code).startswith('error: ') and '\n' not in str(info.value.code)
