"""--source_lang / --target_lang on the NLLB-200, M2M100 and mBART-50 runs converted in
tests/fairseq_models.py (tiny models, every weight drawn), against transformers' own
code: the source is the tokenizer's ``[src_code] X </s>``, the searches' output ids are
``generate``'s with ``forced_bos_token_id`` set to the target code, the text (evaluate's
included) leaves the code out, and ``score`` gives the log-probability of the labels
``[tgt_code] Y </s>`` that Hugging Face's loss takes. Bad languages stop in one line
before any checkpoint is read.

The target language is not the pair the directories' tokenizer_config.json names, so the
codes come from the calls, not from the conversion.
"""

import dataclasses
import json
import re
import shutil
import types

import jax
import numpy as np
import pytest

from tests.fairseq_dirs import lines
from tests.fairseq_models import MODELS
from tests.tiny_run import DECODE_BATCH
from transformer import api, data, decoding, evaluate, score, translate

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

# name: (source code, target code) as each family writes them.
PAIRS = {'nllb': ('eng_Latn', 'fra_Latn'), 'm2m100': ('en', 'fr'), 'mbart50': ('en_XX', 'fr_XX')}
LINES = [s for s, _ in lines(3)]
EXTRA = 8  # output tokens past the input's length: mBART-50's 64 positions hold them
# Where the number of devices checks nothing: one device's programs compile faster than the
# 8 host devices' (tests/compiles.py).
ONE = jax.devices()[:1]


def _hf(fairseq_hf_dirs, name):
    """(Hugging Face's model, its tokenizer for `PAIRS`' source, the target code's id)."""
    _, (_, model_class, tokenizer_class), *_ = MODELS[name]
    src, tgt = PAIRS[name]
    model = getattr(transformers, model_class).from_pretrained(fairseq_hf_dirs / name).eval()
    tokenizer = getattr(transformers, tokenizer_class).from_pretrained(
        fairseq_hf_dirs / name, src_lang=src, tgt_lang=tgt
    )
    code = tokenizer.get_lang_id(tgt) if name == 'm2m100' else tokenizer.convert_tokens_to_ids(tgt)
    return model, tokenizer, code


def _inputs(tokenizer):
    """[B, S] the lines' source ids (EOS last), padded with 1."""
    rows = [[*tokenizer.encode(line), 2] for line in LINES]
    inputs = np.ones((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        inputs[i, : len(row)] = row
    return inputs


# NLLB-200's run in the suite: it is an M2M100 model, and the searches are one code for every
# family; what differs in mBART-50's decoding (its learned positions at the cached step) is
# tests/model/test_fairseq_families.py's. The other two families are in the long tier.
SEARCHED = [
    'nllb',
    pytest.param('m2m100', marks=pytest.mark.long),
    pytest.param('mbart50', marks=pytest.mark.long),
]


@pytest.mark.slow  # transformers' models, 2 searches compiled
@pytest.mark.parametrize('name', SEARCHED)
def test_greedy_and_beam_outputs_equal_generates_with_the_target_code_forced(
    fairseq_hf_dirs, fairseq_runs, name
):
    """Greedy: ``generate(num_beams=1, forced_bos_token_id=code)``, id for id (and samples
    start with the code). Beam 4 with
    the converted run's own length rule (Hugging Face's log P / length^1.0, the generation
    defaults these directories name): ``generate(num_beams=4)``, id for id. Each line is
    generated alone, with ``max_new_tokens`` = its source length + `EXTRA`, our limit for that
    row (the forced code and EOS counted in both); these random models reach that limit, where
    both end the output (eval.eos_at_limit 'none', converted from no forced_eos_token_id)."""
    model, tokenizer, code = _hf(fairseq_hf_dirs, name)
    src, tgt = PAIRS[name]
    # One device: the searches run on the parameters alone, and one device's programs compile
    # faster than the 8 host devices' (tests/compiles.py).
    run = api.load(str(fairseq_runs / name), source_lang=src, target_lang=tgt, devices=ONE)
    assert run.forced == (code,) and run.config.eval.length_penalty == 'fairseq'
    inputs = _inputs(run.tokenizer)
    options = decoding.decode_options(run.config.eval, forced=run.forced)
    options = dataclasses.replace(options, extra_length=EXTRA)
    with jax.default_matmul_precision('float32'):
        greedy = np.asarray(decoding.greedy_search(run.model, run.params, inputs, options=options))
        beams, _ = decoding.beam_search(run.model, run.params, inputs, beam_size=4, options=options)
        if name == 'nllb':  # sampling forces the code too (the same option for every search)
            drawn, _ = decoding.sample_search(run.model, run.params, inputs, options=options)
            assert (np.asarray(drawn)[:, 0, 0] == code).all()
    for row, line in enumerate(LINES):
        source = tokenizer(line, return_tensors='pt')
        theirs_source = source['input_ids'][0].tolist()
        assert inputs[row, : len(theirs_source)].tolist() == theirs_source
        limit = len(theirs_source) + EXTRA
        for beam, ours in ((1, greedy[row]), (4, np.asarray(beams)[row, 0])):
            with torch.no_grad():
                out = model.generate(
                    **source, num_beams=beam, forced_bos_token_id=code, max_new_tokens=limit
                )
            theirs = out[0, 1:].tolist()  # after the decoder's start, </s>
            assert theirs[0] == code
            assert ours[: len(theirs)].tolist() == theirs, (beam, row)
            assert (ours[len(theirs) :] == 1).all()
            text = tokenizer.decode(theirs, skip_special_tokens=True)
            assert run.tokenizer.decode(ours) == text and PAIRS[name][1] not in text


@pytest.mark.slow  # transformers' models
@pytest.mark.parametrize('name', MODELS)
def test_score_is_hugging_faces_log_probability_of_the_labels(
    fairseq_hf_dirs, fairseq_runs, name, tmp_path
):
    """``score`` (the command and `Run.score`): log P = -loss x the label count of Hugging
    Face's model on the labels ``[tgt_code] Y </s>``, the code's own log-probability and
    token counted; each token's log-probability its log_softmax, to 1e-4."""
    model, tokenizer, code = _hf(fairseq_hf_dirs, name)
    src, tgt = PAIRS[name]
    pairs = lines(4)
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    with jax.default_matmul_precision('float32'):
        scored = api.load(str(fairseq_runs / name), devices=ONE).score(
            sources, targets, source_lang=src, target_lang=tgt
        )
    for (source, target), ours in zip(pairs, scored, strict=True):
        batch = tokenizer(source, text_target=target, return_tensors='pt')
        labels = batch['labels'][0]
        assert labels[0] == code and ours.tokens == len(labels)
        with torch.no_grad():
            out = model(**batch)
        picked = torch.log_softmax(out.logits[0], -1)[torch.arange(len(labels)), labels]
        np.testing.assert_allclose(ours.token_log_probs, picked.numpy(), atol=1e-4, rtol=0)
        np.testing.assert_allclose(ours.log_prob, -out.loss.item() * len(labels), atol=1e-4)
    if name != 'nllb':
        return
    files = {}
    for key, texts in (('source', sources), ('target', targets)):
        files[key] = tmp_path / f'{key}.txt'
        files[key].write_text(''.join(t + '\n' for t in texts))
    out = tmp_path / 'scores.tsv'
    flags = [f'--{key}={path}' for key, path in files.items()]
    run = f'--workdir={fairseq_runs / name}'
    _run(score, run, *flags, f'--output={out}', f'--source_lang={src}', f'--target_lang={tgt}')
    logged = [float(row.split('\t')[1]) for row in out.read_text().splitlines()]
    np.testing.assert_allclose(logged, [s.log_prob for s in scored], atol=1e-4)


def _run(command, *args):
    """``command``'s cli with ``args``: its exit code or message (None: success)."""
    with pytest.raises(SystemExit) as info:
        command.cli([command.__name__, *args])
    return info.value.code


@pytest.fixture
def files(tmp_path):
    source = tmp_path / 'in.txt'
    source.write_text('A dog runs.\n')
    return source, tmp_path / 'out.txt'


@pytest.mark.parametrize(
    ('args', 'wanted'),
    [
        ((), r'^error: this run is multilingual \(202 language codes: ace_Arab, ace_Latn'),
        (('--source_lang=eng_Latn',), r'^error: this run is multilingual .*: pass --source_lan'),
        (
            ('--source_lang=eng_Latn', '--target_lang=xyz_Latn'),
            r"^error: --target_lang='xyz_Latn' is not a language code of this NLLB-200 vocab"
            r'ulary \(202 language codes: ace_Arab, ',
        ),
        (('--source_tag=deu_Latn',), r"^error: --source_tag='deu_Latn': this run is multiling"),
    ],
)
def test_a_multilingual_run_without_a_good_pair_stops_in_one_line(
    fairseq_runs, files, args, wanted
):
    """translate, evaluate and score stop before a checkpoint is read; no output file."""
    source, out = files
    for command, named in (
        (translate, (f'--input={source}',)),
        (evaluate, (f'--source={source}', f'--reference={source}')),
        (score, (f'--source={source}', f'--target={source}')),
    ):
        message = _run(
            command, f'--workdir={fairseq_runs / "nllb"}', *named, f'--output={out}', *args
        )
        assert isinstance(message, str) and '\n' not in message, (command, message)
        assert re.match(wanted, message), (command, message)
        assert not out.exists()


def test_a_code_given_to_a_bilingual_run_stops_in_one_line(run_dir, files):
    source, out = files
    message = _run(translate, f'--workdir={run_dir}', f'--input={source}', f'--output={out}',
                   '--target_lang=deu_Latn')  # fmt: skip
    assert message == (
        "error: --target_lang='deu_Latn': this run has no language codes (a bilingual run); "
        'drop --source_lang and --target_lang.'
    )
    assert not out.exists()


def test_the_python_api_checks_the_pair_at_load_and_at_each_call(fairseq_runs):
    with pytest.raises(data.DataError, match=r"^--source_lang='xx' is not a language code"):
        api.load(str(fairseq_runs / 'm2m100'), source_lang='xx', target_lang='de')
    run = api.load(str(fairseq_runs / 'm2m100'))  # the pair may come with each call
    assert run.forced == ()
    with pytest.raises(ValueError, match=r'^this run is multilingual \(100 language codes: '):
        run.translate(['A dog.'])
    with pytest.raises(ValueError, match=r"^--target_lang='zz' is not a language code"):
        run.score(['A dog.'], ['Ein Hund.'], source_lang='en', target_lang='zz')


def test_the_pair_a_run_records_is_the_default(fairseq_runs):
    """``data.source_lang_code`` / ``data.target_lang_code`` in the run's data section name
    its pair where the flags do not; a flag overrides its half."""
    vocabulary = api.load(str(fairseq_runs / 'nllb')).tokenizer
    recorded = types.SimpleNamespace(source_lang_code='eng_Latn', target_lang_code='deu_Latn')
    chosen = data.languages_of(vocabulary, data_config=recorded)
    code = vocabulary.language_id
    assert chosen.pair == ('eng_Latn', 'deu_Latn') and chosen.forced == (code('deu_Latn'),)
    assert chosen.tokenizer.encode('A dog.')[0] == code('eng_Latn')
    other = data.languages_of(vocabulary, None, 'fra_Latn', data_config=recorded)
    assert other.pair == ('eng_Latn', 'fra_Latn') and other.forced == (code('fra_Latn'),)
    recorded.target_lang_code = 'deu'
    with pytest.raises(data.DataError, match=r"^data.target_lang_code='deu' is not a language"):
        data.languages_of(vocabulary, data_config=recorded)


@pytest.mark.slow  # a decode, transformers' model
def test_evaluate_with_a_pair_writes_generates_text_and_names_the_pair(
    fairseq_hf_dirs, fairseq_runs, tmp_path
):
    """evaluate --source --reference of the M2M100 run with a pair, greedy: its hypotheses
    are the text of Hugging Face's ``generate(num_beams=1, forced_bos_token_id=code)`` (the
    run's own limit: input + 50 tokens, which M2M100's sinusoidal positions take), without the
    code; the file name ends with the pair and the JSON's direction is it."""
    model, tokenizer, code = _hf(fairseq_hf_dirs, 'm2m100')
    source = tmp_path / 'in.txt'
    source.write_text(''.join(line + '\n' for line in LINES))
    workdir = tmp_path / 'run'
    shutil.copytree(fairseq_runs / 'm2m100', workdir)
    scores = evaluate.run(
        str(workdir),
        files=(str(source), str(source)),
        source_lang='en',
        target_lang='fr',
        beam_size=1,
        batch_size=DECODE_BATCH,
        devices=ONE,
    )
    (written,) = (workdir / 'eval').glob('*.txt')
    assert written.name.endswith('-en-fr.txt') and scores['direction'] == 'en->fr'
    assert json.loads(written.with_suffix('.json').read_text())['direction'] == 'en->fr'
    for line, text in zip(LINES, written.read_text().splitlines(), strict=True):
        encoded = tokenizer(line, return_tensors='pt')
        limit = encoded['input_ids'].shape[1] + 50
        with torch.no_grad():
            out = model.generate(
                **encoded, num_beams=1, forced_bos_token_id=code, max_new_tokens=limit
            )
        assert text == tokenizer.decode(out[0], skip_special_tokens=True).strip()
