"""Beam search's two length penalties (``eval.length_penalty``): GNMT's ((5 + |y|) / 6)^alpha
and fairseq's |y|^alpha, on a next-token table whose best hypotheses are worked out by hand."""

import logging

import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from tests.decoding.test_decode import MODEL
from transformer import decoding
from transformer.decoding import next_token, translation
from transformer.interop import marian_export
from transformer.model import EOS_ID, PAD_ID
from transformer.schema import EvalSection

A, B, C = 2, 3, 4  # tokens; 0 = pad/start, 1 = EOS
# Next-token probabilities by the previous token (row 0: the first step); columns pad, EOS,
# A, B, C. Its sequences: [A EOS] 0.5 x 0.7 = 0.35, [B C EOS] 0.4 x 0.9 x 0.8 = 0.288,
# [A C EOS] 0.12, [EOS] 0.1, [B C C EOS] 0.0576, [B EOS] 0.04, ...
TABLE = np.array(
    [
        [0.0, 0.1, 0.5, 0.4, 0.0],
        [0.0, 1.0, 0.0, 0.0, 0.0],  # after EOS: never asked
        [0.0, 0.7, 0.0, 0.0, 0.3],  # after A
        [0.0, 0.1, 0.0, 0.0, 0.9],  # after B
        [0.0, 0.8, 0.0, 0.0, 0.2],  # after C
    ]
)


@struct.dataclass
class BigramTable(next_token.Ensemble):
    """A "model" whose next-token log-probabilities are ``TABLE``'s row of the last token.

    The searches hand an `Ensemble` its own encoding and steps; this one has no cache and
    reads only the token fed."""

    def encode_and_cache(self, model, inputs, length):
        return (), ()

    def next_log_probs(self, model, cache, encoded, inputs, last_tokens, cache_mask):
        return self.members[0][last_tokens], cache


def _search(length_penalty: str):
    with np.errstate(divide='ignore'):
        table = BigramTable((jnp.asarray(np.log(TABLE), jnp.float32),))
    inputs = np.array([[A, EOS_ID]], np.int32)  # output limit 2 + 4 = 6 tokens
    sequences, scores = decoding.beam_search(
        MODEL, table, inputs, beam_size=2,
        options=decoding.DecodeOptions(4, alpha=1.0, length_penalty=length_penalty),
    )  # fmt: skip
    return np.asarray(sequences)[0], np.asarray(scores)[0]


def _tokens(sequence: np.ndarray) -> list[int]:
    return [int(t) for t in sequence if t != PAD_ID]


@pytest.mark.parametrize(
    ('rule', 'best'),
    [
        # (tokens, P(y), penalty of |y|). GNMT, alpha 1: log 0.35 / (7/6) = -0.900 beats
        # log 0.288 / (8/6) = -0.934.
        ('gnmt', [([A, EOS_ID], 0.35, 7 / 6), ([B, C, EOS_ID], 0.288, 8 / 6)]),
        # fairseq, alpha 1: log 0.288 / 3 = -0.415 beats log 0.35 / 2 = -0.525.
        ('fairseq', [([B, C, EOS_ID], 0.288, 3), ([A, EOS_ID], 0.35, 2)]),
    ],
)
def test_gnmt_and_fairseq_choose_different_translations(rule, best):
    """Both penalties count |y| with EOS and without the start token; with alpha 1 GNMT's
    keeps the more probable short [A EOS], fairseq's the longer [B C EOS]. Every other
    sequence of the table scores below both under either rule (the next best: [A C EOS],
    log 0.12 / 3 = -0.707 for fairseq; [A C EOS], log 0.12 / (8/6) = -1.590 for GNMT)."""
    sequences, scores = _search(rule)
    assert [_tokens(s) for s in sequences] == [tokens for tokens, _, _ in best]
    expected = [np.log(p) / penalty for _, p, penalty in best]
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    log_probs = translation.sequence_log_probs(sequences, scores, 1.0, rule)
    np.testing.assert_allclose(log_probs, [np.log(p) for _, p, _ in best], rtol=1e-6)


def test_the_penalties_by_hand_and_a_bad_rule():
    np.testing.assert_allclose(decoding.length_penalty(3, 0.6), (8 / 6) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(decoding.length_penalty(3, 0.6, 'fairseq'), 3**0.6, rtol=1e-6)
    assert float(decoding.length_penalty(7, 0.0, 'fairseq')) == 1.0
    with pytest.raises(ValueError, match=r"one of \('gnmt', 'fairseq'\), got 'marian'"):
        decoding.length_penalty(3, 0.6, 'marian')


def test_old_configs_read_as_gnmt_and_a_bad_rule_is_one_line():
    assert EvalSection().length_penalty == 'gnmt'
    with pytest.raises(ValueError, match=r"eval.length_penalty='wu' must be one of 'gnmt'"):
        EvalSection(length_penalty='wu')


def test_the_hugging_face_export_writes_the_exponent_and_warns_for_gnmt(caplog):
    """Hugging Face divides by length^length_penalty: fairseq's rule exactly; GNMT's has no
    such form, which the export says in one line naming eval.length_penalty."""
    cfg = MODEL.config

    def configs(ev):  # as export --format hf computes the exponent and writes it
        exponent = decoding.length_power(ev.alpha, ev.length_penalty)
        return marian_export.marian_configs(cfg, ev, 8, exponent)

    with caplog.at_level(logging.WARNING):
        _, fairseq = configs(EvalSection(alpha=1.2, length_penalty='fairseq'))
    assert fairseq['length_penalty'] == 1.2 and not caplog.records
    with caplog.at_level(logging.WARNING):
        _, gnmt = configs(EvalSection(alpha=0.6))
    assert gnmt['length_penalty'] == 0.6
    [record] = caplog.records
    assert "eval.length_penalty='gnmt'" in record.getMessage() and '\n' not in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        configs(EvalSection(alpha=0.0))  # no penalty: exact either way
    assert not caplog.records


@pytest.mark.slow
def test_the_rule_flows_through_evaluate_translate_and_eval_sweep(run_dir, tmp_path, capsys):
    """``--length_penalty`` reaches the search in evaluate, translate's n-best scores and
    eval_sweep (a row, a file name and a table column each); a run's config gives the default."""
    from benchmarks import eval_sweep
    from transformer import data as data_lib
    from transformer import evaluate, rundir, translate

    # One decode a rule: fairseq's named, GNMT's the run's default (eval.length_penalty).
    common = dict(split='validation', beam_size=2, alpha=1.0, max_examples=5)
    direct = {
        rule: evaluate.run(str(run_dir), **named, output=str(tmp_path / f'{rule}.txt'), **common)
        for rule, named in (('gnmt', {}), ('fairseq', {'length_penalty': 'fairseq'}))
    }
    assert direct['fairseq']['length_penalty'] == 'fairseq'
    assert direct['gnmt']['length_penalty'] == 'gnmt'  # the run's eval.length_penalty
    rows = eval_sweep.main(
        ['--workdir', str(run_dir), '--beam_size=2', '--alpha=1.0', '--max_examples=5']
        + ['--length_penalty', 'gnmt', 'fairseq']
    )
    assert [r['length_penalty'] for r in rows] == ['gnmt', 'fairseq']
    for row in rows:
        assert row['tokenized_bleu'] == direct[row['length_penalty']]['tokenized_bleu']
    sweep = run_dir / 'eval' / 'sweep'
    assert (sweep / 'validation-step4-avg1-beam2-alpha1.0-fairseq.txt').is_file()
    assert '| 1 (steps 4-4) | 2 | 1.0 | fairseq |' in capsys.readouterr().out

    config = rundir.read_config(str(run_dir))
    sources, _ = data_lib.load_text(config.data, 'test')
    infile, outfile = tmp_path / 'in.txt', tmp_path / 'nbest.tsv'
    infile.write_text('\n'.join(sources[:2]) + '\n')
    argv = ['translate', f'--workdir={run_dir}', f'--input={infile}', f'--output={outfile}']
    # Beam 2: the n-best search of test_api.py's translate test, the same compiled program.
    argv += ['--beam_size=2', '--nbest=2', '--alpha=1.0', '--length_penalty=fairseq']
    with pytest.raises(SystemExit) as exit_info:
        translate.cli(argv)
    assert not exit_info.value.code
    tokenizer = rundir.load_tokenizer(config, str(run_dir))  # no checkpoint to restore for it
    rows = [line.split('\t') for line in outfile.read_text().splitlines()]
    assert len(rows) == 4
    for _, _, score, log_prob, text in rows:
        # fairseq, alpha 1: score = log P / |y|, |y| = the hypothesis' pieces + EOS.
        length = len(tokenizer.encode(text)) + 1
        np.testing.assert_allclose(float(score) * length, float(log_prob), rtol=1e-3, atol=1e-3)
