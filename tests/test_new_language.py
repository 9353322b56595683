"""A language code the model lacks, added to the NLLB-200, M2M100 and mBART-50 directories of
tests/test_convert_fairseq.py (tiny models, every weight drawn): a code like the others, its
rows a related code's or the mean of the codes'; trained on, exported, and read back by
transformers with the same id and the same greedy outputs. Bad codes, and a config's pair the
vocabulary lacks, stop in one line before anything is written."""

import json

import jax
import numpy as np
import pytest

from tests.cli import convert_cli
from tests.fairseq_dirs import lines
from tests.tiny_run import DECODE_BATCH, tiny_run_config
from transformer import convert, data, export, interop, translate
from transformer.checkpoint import load_model
from transformer.interop.fairseq_vocab import FairseqVocabulary
from transformer.training import init_from, train_and_evaluate

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

# name: (a new code of the family's shape, a related code it may start from).
NEW = {
    'nllb': ('xyz_Latn', 'deu_Latn'),
    'm2m100': ('__xyz__', '__de__'),
    'mbart50': ('xy_XY', 'de_DE'),
}
EXTRA = 8  # output tokens past the input's length, in both searches


def _rows(run):
    *_, params, _ = load_model(str(run), scan_layers=False)
    return np.asarray(params['shared_embedding']['embedding'])


@pytest.mark.parametrize('name', NEW)
def test_a_new_code_is_a_code_and_starts_from_the_like_or_the_codes_mean(
    fairseq_hf_dirs,
    name,
    tmp_path,
):
    """``--add_tokens=CODE=LIKE,CODE2``: both are codes of the run's vocabulary at V and
    V + 1; CODE's row is LIKE's, CODE2's the mean of the codes' rows (not of all rows)."""
    code, like = NEW[name]
    second = {'nllb': 'abc_Cyrl', 'm2m100': '__ab__', 'mbart50': 'ab_AB'}[name]
    run = tmp_path / 'run'
    message = convert_cli(
        f'--from_hf={fairseq_hf_dirs / name}',
        f'--workdir={run}',
        f'--add_tokens={code}={like},{second}',
    )
    assert message is None, message
    vocab = FairseqVocabulary(run / 'vocab')
    rows = _rows(run)
    before = FairseqVocabulary(fairseq_hf_dirs / name).language_tokens()
    assert vocab.language_tokens() == [*before, code, second]
    new = vocab.token_id(code)
    assert new == rows.shape[0] - 2 and vocab.token_id(second) == new + 1
    np.testing.assert_array_equal(rows[new], rows[vocab.token_id(like)])
    codes = rows[[vocab.token_id(c) for c in before]]
    np.testing.assert_allclose(rows[new + 1], codes.mean(axis=0), rtol=1e-6, atol=1e-7)
    assert not np.allclose(rows[new + 1], rows[:new].mean(axis=0), atol=1e-3)
    short = code.strip('_') if name == 'm2m100' else code  # M2M100's codes are also 'de'
    assert vocab.prefixes('de' if name == 'm2m100' else like, short).target == (new,)


def test_init_from_adds_a_code_the_pair_and_the_mix_take(
    fairseq_hf_dirs, fairseq_runs, lines_folder
):
    """``train.init_from=DIR`` with ``train.add_tokens=xyz_Latn``: the run's vocabulary has the
    code (a pair and a mix entry's pair take it, the target code forced first); its start row
    is the mean of the codes' rows, every other row the directory's."""
    start = init_from.read_start(str(fairseq_hf_dirs / 'nllb'))
    start.added = data.added_tokens.parse('xyz_Latn')
    vocab = init_from.run_vocabulary(start)
    code = vocab.language_id('xyz_Latn')
    assert code == vocab.vocab_size - 1 and vocab.language_tokens()[-1] == 'xyz_Latn'
    assert data.LanguagePair(vocab, 'eng_Latn', 'xyz_Latn').forced == (code,)
    config = tiny_run_config(1).data
    config.update(
        dataset='folder', folder=lines_folder, mix=f'x={lines_folder}:1:deu_Latn->xyz_Latn'
    )
    config.update(source_lang_code='eng_Latn', target_lang_code='deu_Latn')
    data.check_mix_vocabulary(config, vocab)
    with pytest.raises(data.DataError, match="^data.mix entry 'x'.*'xyz_Latn' is not a lang"):
        data.check_mix_vocabulary(config, start.tokenizer)  # the directory's own: no such code
    *_, converted, _ = load_model(str(fairseq_runs / 'nllb'), scan_layers=False)
    rows = np.asarray(converted['shared_embedding']['embedding'])
    grown = {**converted, 'shared_embedding': {'embedding': np.zeros((code + 1, rows.shape[1]))}}
    started = init_from.start_params(start, jax.tree.map(jax.numpy.asarray, grown))
    table = np.asarray(started['shared_embedding']['embedding'])
    np.testing.assert_array_equal(table[:code], rows)
    codes = [vocab.token_id(c) for c in vocab.language_tokens()[:-1]]
    np.testing.assert_allclose(table[code], rows[codes].mean(axis=0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    'spec, message',
    [
        ('xyz_Latn=<unk>', "a new language code starts from the row of a related language's"),
        ('xyz_Latn=abc_Latn', "'abc_Latn' is not a token of the vocabulary"),
        ('deu_Latn', "'deu_Latn' is already a token of the vocabulary"),
        ('xyz=deu_Latn', "is not shaped as this vocabulary's codes, xxx_Xxxx (eng_Latn)"),
    ],
)
def test_bad_new_codes_stop_in_one_line_and_write_nothing(fairseq_hf_dirs, tmp_path, spec, message):
    run = tmp_path / 'run'
    text = convert_cli(
        f'--from_hf={fairseq_hf_dirs / "nllb"}', f'--workdir={run}', f'--add_tokens={spec}'
    )
    assert message in text and '\n' not in text.strip(), text
    assert not run.exists()


def test_a_configs_pair_is_checked_against_the_vocabulary_with_its_new_codes(
    fairseq_hf_dirs, tmp_path
):
    """convert with a config naming ``data.target_lang_code``: a code added at the same
    conversion is recorded; one the vocabulary lacks, or half a pair, stops in one line
    naming the key and a few codes, before anything is written."""
    base = tiny_run_config(1)
    base.data.update(source_lang_code='eng_Latn', target_lang_code='xyz_Latn')
    config = convert.convert(str(fairseq_hf_dirs / 'nllb'), str(tmp_path / 'a'), base, 'xyz_Latn')
    assert (config.data.source_lang_code, config.data.target_lang_code) == ('eng_Latn', 'xyz_Latn')
    recorded = json.loads((tmp_path / 'a' / 'config.json').read_text())['data']
    assert recorded['target_lang_code'] == 'xyz_Latn'
    for target, add, message in (
        ('xyz_Latn', None, "data.target_lang_code='xyz_Latn' is not a language code of this"),
        ('xyz_Latn', 'xyz_Cyrl', '203 language codes: ace_Arab, ace_Latn, acm_Arab, ...'),
        (None, None, "data.source_lang_code='eng_Latn' needs data.target_lang_code too"),
    ):
        base.data.target_lang_code = target
        with pytest.raises(interop.PretrainedError) as info:
            convert.convert(str(fairseq_hf_dirs / 'nllb'), str(tmp_path / 'b'), base, add)
        text = str(info.value)
        assert text.startswith('--config: ') and message in text and '\n' not in text, text
        assert not (tmp_path / 'b').exists()


@pytest.mark.slow  # a conversion, a few training steps, an export read by transformers
def test_a_new_code_trained_and_exported_translates_in_hugging_face_as_here(
    fairseq_hf_dirs,
    lines_folder,
    tmp_path,
    capsys,
):
    """NLLB-200 with ``xyz_Latn`` (from deu_Latn's row) fine-tuned a few steps as the target of
    English: the code's row moved; the export's tokenizer (AutoTokenizer, tgt_lang=xyz_Latn)
    gives it our id, as a target code; generate(forced_bos_token_id=it, num_beams=1) gives
    the text of our translate --target_lang xyz_Latn on every line; the CTranslate2 export's
    vocabulary holds it at that id."""
    start, run, out = tmp_path / 'start', tmp_path / 'run', tmp_path / 'hf'
    message = convert_cli(
        f'--from_hf={fairseq_hf_dirs / "nllb"}',
        f'--workdir={start}',
        '--add_tokens=xyz_Latn=deu_Latn',
    )
    assert message is None, message
    config = tiny_run_config(2)
    config.data.update(
        dataset='folder',
        folder=lines_folder,
        source_lang_code='eng_Latn',
        target_lang_code='xyz_Latn',
    )
    config.model.dropout_rate = 0.0
    config.train.update(init_from=str(start), batch_size=8, checkpoint_every=2)
    # A larger rate makes this tiny model end every output at once: empty texts compare less.
    config.opt.update(schedule='constant', lr_scale=1e-3)
    config.eval.update(extra_length=EXTRA, eos_at_limit='none')
    # One device: the code's row moves alike on any number, and one device's programs compile
    # faster than the 8 host devices' (tests/compiles.py).
    train_and_evaluate(config, str(run), devices=jax.devices()[:1])
    for fmt, where in (('hf', out), ('ctranslate2', tmp_path / 'ct2')):
        with pytest.raises(SystemExit) as info:
            export.cli(['export', f'--workdir={run}', f'--out={where}', f'--format={fmt}'])
        assert info.value.code is None, info.value.code
    ours = FairseqVocabulary(run / 'vocab')
    code = ours.language_id('xyz_Latn')
    rows = _rows(run)
    assert not np.allclose(rows[code], rows[ours.language_id('deu_Latn')])
    vocabulary = json.loads((tmp_path / 'ct2' / 'shared_vocabulary.json').read_text())
    assert vocabulary.index('xyz_Latn') == code
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        out, src_lang='eng_Latn', tgt_lang='xyz_Latn'
    )
    assert tokenizer.convert_tokens_to_ids('xyz_Latn') == code
    assert tokenizer(text_target='Ein Hund.')['input_ids'][0] == code
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(out).eval()
    np.testing.assert_allclose(model.model.shared.weight[code].detach().numpy(), rows[code])
    sources = [' '.join(s.split()[:4]) for s, _ in lines(4)]  # short: generate is a loop
    source = tmp_path / 'in.txt'
    source.write_text(''.join(s + '\n' for s in sources))
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        translate.cli(
            ['translate', f'--workdir={run}', f'--input={source}', '--beam_size=1']
            + ['--source_lang=eng_Latn', '--target_lang=xyz_Latn']
            + [f'--batch_size={DECODE_BATCH}']
        )
    assert info.value.code in (None, 0), info.value.code
    here = capsys.readouterr().out.splitlines()
    assert any(here), here
    for line, text in zip(sources, here, strict=True):
        encoded = tokenizer(line, return_tensors='pt')
        limit = encoded['input_ids'].shape[1] + EXTRA
        with torch.no_grad():
            generated = model.generate(
                **encoded, forced_bos_token_id=code, num_beams=1, max_new_tokens=limit
            )
        assert generated[0, 1].item() == code
        assert text == tokenizer.decode(generated[0], skip_special_tokens=True)
