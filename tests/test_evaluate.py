"""BLEU, checkpoint loading and averaging, and the evaluate / translate / visualize commands."""

import json
import shutil

import jax
import numpy as np
import pytest
import sacrebleu

from transformer import evaluate, trainer


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """A tiny synthetic training run with checkpoints at steps 2 and 4."""
    from tests.test_trainer import _tiny_run_config

    config = _tiny_run_config(4)
    config.train.checkpoint_every = 2
    workdir = tmp_path_factory.mktemp('run')
    trainer.train_and_evaluate(config, str(workdir))
    return workdir


def test_sacrebleu_and_chrf_equal_sacrebleu_itself():
    """The reported cased sacreBLEU / chrF are sacrebleu's corpus scores of the same text."""
    hyps = ['Ein Mann fährt ein rotes Fahrrad.', 'Zwei Hunde spielen im Schnee.']
    refs = ['Ein Mann fährt auf einem roten Fahrrad.', 'Zwei Hunde spielen im Schnee.']
    scores = evaluate.bleu_scores(hyps, refs, target_lang='de')
    assert scores['sacrebleu'] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert scores['chrf'] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert 'tok:13a' in scores['sacrebleu_signature']
    assert 0 < scores['sacrebleu'] < 100


def test_tokenized_bleu_lowercases_and_splits_compounds():
    """Lowercased tokenized BLEU ignores case; compound splitting turns a-b into three tokens,
    as tensor2tensor's get_ende_bleu.sh does (only the first hyphen of a-b-c, like its regex)."""
    assert evaluate.split_compounds('Mann-Hund , x-y-z') == (
        'Mann ##AT##-##AT## Hund , x ##AT##-##AT## y-z'
    )
    hyps, refs = ['EIN MANN LÄUFT .'], ['ein Mann läuft.']
    cased = evaluate.bleu_scores(hyps, refs, target_lang='de')
    lower = evaluate.bleu_scores(hyps, refs, target_lang='de', lowercase_tokenized=True)
    assert lower['tokenized_bleu'] == pytest.approx(100.0)
    assert cased['tokenized_bleu'] < 50
    split = evaluate.bleu_scores(
        ['ein Mann-Hund läuft schnell weg'],
        ['ein Mann-Hund läuft schnell weg'],
        target_lang='de',
        compound_split=True,
    )
    assert split['tokenized_bleu'] == pytest.approx(100.0)
    assert 'compound-split' in split['tokenized_bleu_convention']


def test_average_of_two_checkpoints_is_their_mean(run_dir):
    """--average_last 2 loads the element-wise mean of the step-2 and step-4 parameters."""
    _, _, _, averaged, steps = evaluate.load_model(str(run_dir), average_last=2)
    assert steps == [2, 4]
    _, _, _, p2, _ = evaluate.load_model(str(run_dir), step=2)
    _, _, _, p4, _ = evaluate.load_model(str(run_dir), step=4)
    changed = 0
    for a, x, y in zip(*(jax.tree.leaves(t) for t in (averaged, p2, p4)), strict=True):
        np.testing.assert_allclose(a, (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6)
        changed += int(not np.allclose(x, y))
    assert changed > 0  # the two checkpoints differ, so the mean is not trivially either


def test_evaluate_command_writes_hypotheses_and_scores(run_dir, tmp_path):
    """`python -m transformer.evaluate` decodes the test split with beam search, prints the
    scores and writes one hypothesis per reference plus a JSON of the scores."""
    out = tmp_path / 'hyps.txt'
    with pytest.raises(SystemExit) as exit_info:
        evaluate.cli(
            [
                'evaluate',
                f'--workdir={run_dir}',
                '--beam_size=2',
                '--max_examples=7',
                f'--output={out}',
            ]
        )
    assert not exit_info.value.code
    lines = out.read_text().splitlines()
    assert len(lines) == 7
    scores = json.loads(out.with_suffix('.json').read_text())
    assert scores['num_sentences'] == 7 and scores['beam_size'] == 2 and scores['steps'] == [4]
    assert 0.0 <= scores['sacrebleu'] <= 100.0


def test_missing_workdir_checkpoint_and_vocab_are_one_line_errors(run_dir, tmp_path):
    """No config, no checkpoints, an unknown step, no vocabulary: an EvaluationError whose
    single line names what is missing, not a traceback from inside Orbax."""
    with pytest.raises(evaluate.EvaluationError, match='config.json not found'):
        evaluate.load_model(str(tmp_path / 'nowhere'))
    broken = tmp_path / 'broken'
    shutil.copytree(run_dir, broken)
    with pytest.raises(evaluate.EvaluationError, match=r'No checkpoint for step 3.*\[2, 4\]'):
        evaluate.load_model(str(broken), step=3)
    shutil.rmtree(broken / 'vocab')
    with pytest.raises(evaluate.EvaluationError, match='No vocabulary'):
        evaluate.load_model(str(broken))
    shutil.copytree(run_dir / 'vocab', broken / 'vocab')
    shutil.rmtree(broken / 'checkpoints')
    with pytest.raises(evaluate.EvaluationError, match='No checkpoints'):
        evaluate.load_model(str(broken))


def test_checkpoint_of_another_model_shape_is_a_clear_error(run_dir, tmp_path):
    """A config.json whose model differs from the saved parameters fails with one line."""
    other = tmp_path / 'other'
    shutil.copytree(run_dir, other)
    config = json.loads((other / 'config.json').read_text())
    config['model']['d_ff'] = 48
    (other / 'config.json').write_text(json.dumps(config))
    with pytest.raises(evaluate.EvaluationError, match='does not fit the model') as info:
        evaluate.load_model(str(other))
    assert '\n' not in str(info.value)


def test_partial_checkpoint_is_a_clear_error(run_dir, tmp_path):
    """A checkpoint whose parameter files are gone (a copy cut short) fails with one line."""
    partial = tmp_path / 'partial'
    shutil.copytree(run_dir, partial)
    for path in (partial / 'checkpoints' / '4' / 'params').iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name != '_METADATA':
            path.unlink()
    with pytest.raises(evaluate.EvaluationError) as info:
        evaluate.load_model(str(partial), step=4)
    assert '\n' not in str(info.value)


def test_translate_keeps_blank_lines_and_survives_overlong_lines(run_dir, tmp_path):
    """`python -m transformer.translate`: one output line per input line, blank lines stay
    blank, an over-long line is cut (not crashed on), and a sentence translates the same
    alone as inside a batch."""
    from transformer import data as data_lib
    from transformer import translate

    sources, _ = data_lib.load_text(json_config(run_dir).data, 'test')
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
    _, tokenizer, model, params, _ = evaluate.load_model(str(run_dir))
    alone = translate.translate_lines(
        [sources[1]],
        tokenizer,
        model,
        params,
        beam_size=2,
        alpha=0.6,
        extra_length=50,
        batch_size=4,
        max_input_tokens=24,
    )
    assert alone == [out[4]]


def test_attention_maps_cover_every_layer_and_head(run_dir, tmp_path):
    """visualize: one [N, T, S] map per (stack, layer, kind), rows summing to 1, and a figure."""
    from transformer import visualize
    from transformer.model import EOS_ID

    _, tokenizer, model, params, _ = evaluate.load_model(str(run_dir))
    inputs = np.array(tokenizer.encode('ze bix pud .') + [EOS_ID], np.int32)
    targets = np.array(tokenizer.encode('lo bix pud .') + [EOS_ID], np.int32)
    maps = visualize.attention_maps(model, params, inputs, targets)
    assert sorted(maps) == [
        ('decoder', 0, 'cross_attention'),
        ('decoder', 0, 'self_attention'),
        ('encoder', 0, 'self_attention'),
    ]
    num_heads = model.config.num_heads
    assert maps[('encoder', 0, 'self_attention')].shape == (num_heads, len(inputs), len(inputs))
    assert maps[('decoder', 0, 'cross_attention')].shape == (num_heads, len(targets), len(inputs))
    for weights in maps.values():
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    causal = maps[('decoder', 0, 'self_attention')]
    assert np.all(np.triu(causal, k=1) == 0)
    out = tmp_path / 'attention.png'
    visualize.plot_attention(maps, [str(i) for i in inputs], [str(i) for i in targets], str(out))
    assert out.stat().st_size > 1000


def json_config(workdir):
    return evaluate.load_workdir_config(str(workdir))
