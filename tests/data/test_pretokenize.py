"""data.pretokenize='moses': the Multi30k files' text in, detokenized text out, and the rules
that keep runs, caches and vocabularies of the two preprocessings apart."""

import hashlib
import html
import json
import os
import re

import pytest
import sentencepiece as spm
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from transformer import data, run_changes, rundir, schema
from transformer.commands import export as export_command
from transformer.data import pretokenize, sources, tokenized
from transformer.data import tokenizer as tokenizer_lib

# English text that Moses escapes, splits or normalises; the vocabulary is trained on it.
HOSTILE = [
    'A man\'s "big" hat.',
    "Don't say 'no'!",
    'Tom & Jerry <3 AT&T',
    'a | b > c < d',
    '[Brackets] (parens) {braces}',
    'a well-known co-op -- mid-air - dash',
    '“Curly” ‘quotes’ «guillemets» „low“ — em – en … ellipsis',
    '1,000,000.50 dollars and 3,5 kg',
    'See https://example.com/a-b?c=1&d=2 now.',
    '',
    '   runs \t of   whitespace   ',
    'Ünïcödé Straße café',
]
# Lines whose Moses tokens detokenize back to the lowercased, normalised sentence itself.
EXACT = {
    'A man\'s "big" hat.': 'a man\'s "big" hat.',
    '[Brackets] (parens) {braces}': '[brackets] (parens) {braces}',
    '1,000,000.50 dollars and 3,5 kg': '1,000,000.50 dollars and 3,5 kg',
    '': '',
    '   runs \t of   whitespace   ': 'runs of whitespace',
    'Ünïcödé Straße café': 'ünïcödé straße café',
}
GERMAN = ['Ein Mann rasiert seinen Bart.', 'Zwei Hunde laufen über die Straße.']
ENTITY = re.compile(r'&(quot|apos|amp|lt|gt|#\d+);')


def _config(folder, **overrides):
    config = schema.default_config().data
    config.update(dict(dataset='folder', folder=str(folder), vocab_size=300))
    config.update(overrides)
    return config


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """German -> English files, so that the hostile English is the side outputs are in."""
    root = tmp_path_factory.mktemp('text')
    for split in ('train', 'validation'):
        (root / f'{split}.en').write_text('\n'.join(HOSTILE * 4) + '\n')
        (root / f'{split}.de').write_text('\n'.join(GERMAN * 24) + '\n')
    return root


def _moses_config(folder, **overrides):
    settings = dict(vocab_normalization='nmt_nfkc_cf', source_lang='de', target_lang='en')
    return _config(folder, pretokenize='moses', **{**settings, **overrides})


@pytest.fixture(scope='module')
def moses(folder, tmp_path_factory):
    path = tmp_path_factory.mktemp('moses') / 'spm.model'
    return data.get_tokenizer(_moses_config(folder), str(path))


@pytest.fixture(scope='module')
def raw(folder, tmp_path_factory):
    path = tmp_path_factory.mktemp('raw') / 'spm.model'
    return data.get_tokenizer(_config(folder, source_lang='de', target_lang='en'), str(path))


def _tokens_read(tokenizer, text: str) -> list[str]:
    """The tokens the vocabulary reads for ``text``, unescaped."""
    return [html.unescape(t) for t in tokenizer.pretokenizer.encode(text, 'target').split()]


@pytest.mark.parametrize('text', HOSTILE)
def test_round_trip_gives_the_normalised_sentence_never_an_entity(moses, text):
    ids = moses.encode(text, 'target')
    out = moses.decode(ids)
    assert not ENTITY.search(out), out
    assert '⁇' not in out  # every piece known: the comparison below is of the text itself
    # The output is those tokens, detokenized: Moses splits it into them again.
    assert MosesTokenizer(lang='en').tokenize(out, escape=False) == _tokens_read(moses, text)
    if text in EXACT:
        assert out == EXACT[text]


def test_the_vocabulary_reads_the_escaped_moses_text(moses):
    """What the model sees is the Multi30k files' text: escaped entities, split punctuation."""
    pieces = ''.join(moses.id_to_piece(i) for i in moses.encode('A "B" & c\'s.', 'target'))
    assert pieces.replace('▁', ' ').strip() == 'a &quot; b &quot; &amp; c &apos;s .'
    # Decoding unescapes whatever entities a model emits (pieces of Moses' escaped text).
    model = spm.SentencePieceProcessor(model_file=moses.model_path)
    out = moses.decode(model.encode('x &quot; &apos; &amp; &lt; &gt; &#124; &#91; &#93;'))
    assert not ENTITY.search(out) and out.replace(' ', '') == 'x"\'&<>|[]'


def test_each_side_is_tokenized_with_its_own_language(moses):
    # English splits "man's" as "man 's", German (the source here) as "man ' s".
    assert moses.pretokenizer.encode("man's", 'target') == 'man &apos;s'
    assert moses.pretokenizer.encode("man's", 'source') == 'man &apos; s'
    assert moses.encode("man's", 'source') != moses.encode("man's", 'target')
    with pytest.raises(ValueError, match='side must be one of'):
        moses.encode('x', 'both')


def test_lowercasing_comes_first_when_the_vocabulary_folds():
    """German 'Bart.' is a Moses non-breaking prefix, 'bart.' is not: lowercasing after
    tokenizing (the vocabulary's fold alone) would keep the full stop on the word."""
    folding = pretokenize.Pretokenizer('moses', 'en', 'de', lowercase=True)
    cased = pretokenize.Pretokenizer('moses', 'en', 'de', lowercase=False)
    assert folding.encode(GERMAN[0], 'target') == 'ein mann rasiert seinen bart .'
    assert cased.encode(GERMAN[0], 'target') == 'Ein Mann rasiert seinen Bart.'


def test_the_perl_scripts_quirks_are_kept_and_stay_local():
    """normalize-punctuation.perl turns a lone '’' into '"', and reads each line with its
    newline (German moves a full stop out of closing quotes only before another character):
    both are in the Multi30k files. sacremoses' own switch for the first changes the class."""
    german = pretokenize.Pretokenizer('moses', 'en', 'de', lowercase=True)
    assert german.encode('Das „Hook ’em Horns“-Zeichen.', 'target') == (
        'das &quot; hook &quot; em horns &quot; -zeichen .'
    )
    assert german.encode('Es steht: „Tee.“', 'target') == 'es steht : &quot; tee &quot; .'
    assert german.encode('Peter’s Hut', 'target') == 'peter &apos; s hut'  # between letters
    assert MosesPunctNormalizer(lang='en').normalize('a ’b') == "a 'b"  # others unchanged


@pytest.mark.parametrize('normalization', tokenizer_lib.NORMALIZATIONS)
def test_the_vocabulary_folds_exactly_when_its_normalization_says_so(tmp_path, normalization):
    """The sample is lowercased by the config's name, a loaded vocabulary by its behaviour:
    both readings of the one setting agree."""
    trained = tokenizer_lib.train_tokenizer(
        ['Ein Mann', 'A Man'] * 20,
        str(tmp_path / 'spm.model'),
        vocab_size=40,
        normalization=normalization,
    )
    assert trained.pretokenizer.lowercase == normalization.endswith('_cf')


def test_a_cased_vocabulary_keeps_the_case(folder, tmp_path):
    cased = data.get_tokenizer(
        _moses_config(folder, vocab_normalization='nmt_nfkc'), str(tmp_path / 'spm.model')
    )
    assert cased.decode(cased.encode('See Tom & Jerry.', 'target')) == 'See Tom & Jerry.'


def test_raw_text_is_left_alone(raw):
    assert raw.pretokenize == 'none' and raw.id_to_piece(3) != pretokenize.MOSES_MARK
    text = 'A man\'s "big" hat.'
    assert raw.decode(raw.encode(text)) == text


def test_the_vocabularies_of_the_two_preprocessings_differ(moses, raw):
    assert moses.pretokenize == 'moses'
    assert moses.id_to_piece(3) == pretokenize.MOSES_MARK  # the control piece that says so
    assert moses.fingerprint != raw.fingerprint


def test_none_keeps_every_existing_cache_key(raw, folder):
    """The identity of a raw-text run is what it was, so the caches of existing runs stay."""
    before = {'dataset': 'multi30k', 'source_lang': 'en', 'target_lang': 'de', 'split': 'train'}
    config = _config(folder, dataset='multi30k')
    assert sources.identity(config, 'train') == before
    key = {**before, 'vocab': raw.fingerprint}
    old_key = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    assert tokenized.cache_key(config, raw, 'train') == old_key
    moses_config = _config(folder, dataset='multi30k', pretokenize='moses')
    assert sources.identity(moses_config, 'train') == {**before, 'pretokenize': 'moses'}
    assert tokenized.cache_key(moses_config, raw, 'train') != old_key


def test_the_cached_ids_are_the_moses_text(moses, folder, tmp_path):
    tokenized.clear_memory_cache()
    split = data.tokenize_split(_moses_config(folder), moses, 'train', str(tmp_path))
    assert split.num_examples == len(HOSTILE) * 4
    assert moses.decode(split.target(0)) == EXACT[HOSTILE[0]]
    assert moses.decode(split.source(0)) == 'ein mann rasiert seinen bart.'
    assert list(split.source(0)[:-1]) == moses.encode(GERMAN[0], 'source')


def test_a_vocabulary_of_the_other_preprocessing_is_refused(moses, raw, folder):
    given = _moses_config(folder, vocab_path=raw.model_path)
    with pytest.raises(data.DataError) as info:
        data.get_tokenizer(given, None)
    assert str(info.value) == (
        f"data.vocab_path={raw.model_path} was trained with data.pretokenize='none', not "
        "'moses': set data.pretokenize='none' or give data.vocab_path one trained with 'moses'."
    )
    given = _config(folder, source_lang='de', target_lang='en', vocab_path=moses.model_path)
    with pytest.raises(data.DataError, match="trained with data.pretokenize='moses', not 'none'"):
        data.get_tokenizer(given, None)
    # The run's own vocabulary, reused with the setting changed: a new workdir is the way.
    with pytest.raises(data.DataError) as info:
        data.get_tokenizer(_moses_config(folder), raw.model_path)
    assert str(info.value).endswith("set data.pretokenize='none' or use a new --workdir.")
    assert '\n' not in str(info.value)


def _write_run(workdir, config) -> None:
    os.makedirs(os.path.join(workdir, 'vocab'))
    open(os.path.join(workdir, rundir.VOCAB_FILE), 'wb').close()
    rundir.write_config(workdir, config)


def test_a_resume_that_changes_pretokenize_is_refused(tmp_path):
    assert 'data.pretokenize' not in run_changes.RESUME_FREE
    workdir = str(tmp_path / 'run')
    _write_run(workdir, schema.parse(schema.default_config()))
    changed = schema.default_config()
    changed.data.pretokenize = 'moses'
    with pytest.raises(rundir.WorkdirError) as info:
        run_changes.resume_changes(workdir, schema.parse(changed))
    assert str(info.value) == (
        f"{workdir} holds a run trained with data.pretokenize='none', not 'moses': a run keeps "
        'its model and data. Resume with its settings, or use a new --workdir.'
    )


def test_a_config_json_without_the_key_reads_as_none(tmp_path):
    workdir = str(tmp_path / 'run')
    _write_run(workdir, schema.parse(schema.default_config()))
    config_path = os.path.join(workdir, rundir.CONFIG_FILE)
    values = json.load(open(config_path))
    del values['data']['pretokenize']
    json.dump(values, open(config_path, 'w'))
    assert rundir.read_config(workdir).data.pretokenize == 'none'
    assert run_changes.resume_changes(workdir, schema.parse(schema.default_config())) == []


def test_the_setting_is_checked_and_described():
    config = schema.default_config()
    config.data.pretokenize = 'spacy'
    with pytest.raises(schema.ConfigError, match='pretokenize'):
        schema.parse(config)
    assert 'Moses' in schema.descriptions()['data.pretokenize']


def test_export_refuses_a_moses_run_before_it_needs_packages(tmp_path):
    workdir = str(tmp_path / 'run')
    config = schema.default_config()
    config.data.pretokenize = 'moses'
    _write_run(workdir, schema.parse(config))
    for format in ('hf', 'ctranslate2'):
        with pytest.raises(export_command.ExportError) as info:
            export_command.export(workdir, str(tmp_path / 'out'), format=format)
        assert str(info.value).startswith("data.pretokenize='moses' cannot be exported: ")
        assert '\n' not in str(info.value)
    assert not os.path.exists(tmp_path / 'out')
