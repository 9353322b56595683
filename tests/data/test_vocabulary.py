"""A vocabulary's special ids: one value (`SpecialIds`), recorded in config.json's data section,
read back from there, checked against the vocabulary a run loads, and kept by a resume."""

import json

import numpy as np
import pytest

from tests.tiny_run import run_dir_with, tiny_run_config
from transformer import data, run_changes, rundir, schema
from transformer.data import tokenizer as tokenizer_lib
from transformer.tokens import JOINT, SpecialIds

# NLLB-200's layout: <s> 0, <pad> 1, </s> 2, <unk> 3, the decoder starting from </s>.
NLLB_LIKE = SpecialIds(pad=1, eos=2, unk=3, decoder_start=2, never_emit=(1, 0))


def _with_ids(config, special: SpecialIds):
    config.data.update(data.special_fields(special))
    return config


def test_the_joint_ids_are_the_default_and_a_run_records_them():
    experiment = schema.parse(tiny_run_config(1))
    assert experiment.data.special == experiment.model.special == JOINT
    assert (JOINT.pad, JOINT.eos, JOINT.unk, JOINT.decoder_start) == (0, 1, 2, 0)
    recorded = schema.to_dict(experiment)['data']
    assert {k: recorded[k] for k in data.SPECIAL_FIELDS} == {
        'pad_id': 0,
        'eos_id': 1,
        'unk_id': 2,
        'decoder_start_id': 0,
        'never_emit': '0',
    }
    assert 'special' not in schema.to_dict(experiment)['model']  # the data section holds them


def test_other_ids_go_from_the_config_to_the_model_and_back():
    experiment = schema.parse(_with_ids(tiny_run_config(1), NLLB_LIKE))
    assert experiment.data.special == experiment.model.special == NLLB_LIKE
    assert NLLB_LIKE.never_emit == (0, 1)  # sorted, pad included
    again = schema.parse(schema.to_dict(experiment))
    assert again.model.special == NLLB_LIKE


def test_a_config_json_written_before_the_ids_loads_with_the_joint_ones(tmp_path):
    workdir, config = run_dir_with(tmp_path)
    values = json.loads((workdir / rundir.CONFIG_FILE).read_text())
    for key in data.SPECIAL_FIELDS:
        del values['data'][key]
    (workdir / rundir.CONFIG_FILE).write_text(json.dumps(values))
    assert rundir.read_config(str(workdir)).model.special == JOINT


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'pad_id': 1}, r'pad_id=1, eos_id=1 and unk_id=2 must be three different ids'),
        ({'never_emit': '0,1'}, r'never_emit holds eos_id=1: a search must end'),
        ({'never_emit': '0;5'}, r"data.never_emit='0;5' must be comma-separated ids"),
        ({'decoder_start_id': 5000}, r'data.vocab_size=\d+ holds no id 5000'),
        ({'unk_id': -1}, r'data.unk_id=-1 must be >= 0'),
    ],
)
def test_ids_that_cannot_work_are_refused_in_one_line(overrides, message):
    config = tiny_run_config(1)
    config.data.update(overrides)
    with pytest.raises(schema.ConfigError, match=message) as info:
        schema.parse(config)
    assert '\n' not in str(info.value)


def test_a_resume_that_changes_the_ids_is_refused(tmp_path):
    workdir, config = run_dir_with(tmp_path)
    assert run_changes.resume_changes(str(workdir), schema.parse(config)) == []
    config = _with_ids(config, SpecialIds(pad=0, eos=1, unk=2, decoder_start=1, never_emit=()))
    with pytest.raises(rundir.WorkdirError, match=r'data.decoder_start_id=0, not 1'):
        run_changes.resume_changes(str(workdir), schema.parse(config))


def test_a_vocabulary_whose_ids_are_not_the_runs_is_refused_where_it_loads(tmp_path):
    tokenizer = tokenizer_lib.train_tokenizer(
        ['ze bland robop', 'robop ze', 'bland'] * 20, str(tmp_path / 'spm.model'), vocab_size=40
    )
    assert isinstance(tokenizer, data.Vocabulary) and tokenizer.special == JOINT
    config = schema.parse(
        _with_ids(tiny_run_config(1), SpecialIds(3, 1, 2, decoder_start=3, never_emit=()))
    )
    workdir = tmp_path / 'run'
    (workdir / 'vocab').mkdir(parents=True)
    tokenizer.copy_to(workdir / 'vocab')
    assert (workdir / 'vocab' / 'spm.model').read_bytes() == (tmp_path / 'spm.model').read_bytes()
    with pytest.raises(
        rundir.WorkdirError, match=r'has the special ids pad_id=0 .* records pad_id=3'
    ):
        rundir.load_tokenizer(config, str(workdir))
    loaded = rundir.load_tokenizer(schema.parse(tiny_run_config(1)), str(workdir))
    assert loaded.fingerprint == tokenizer.fingerprint


class ToyVocabulary:
    """A word-level vocabulary with NLLB-200's special ids: a `data.Vocabulary` that is no
    SentencePiece model."""

    special = NLLB_LIKE
    fingerprint = 'toy'
    pretokenize = 'none'
    PIECES = ('<s>', '<pad>', '</s>', '<unk>', 'ze', 'bland', 'robop', 'pud', '__eng__')

    @property
    def vocab_size(self) -> int:
        return len(self.PIECES)

    def encode(self, text, side='source'):
        return [self.token_id(w) or self.special.unk for w in text.split()]

    def encode_batch(self, texts, side='source'):
        return [self.encode(text, side) for text in texts]

    def decode(self, ids):
        words = []
        for i in ids:
            if i == self.special.eos:
                break
            if i not in self.special.never_emit:
                words.append(self.PIECES[i])
        return ' '.join(words)

    def id_to_piece(self, i):
        return self.PIECES[i]

    def token_id(self, piece):
        return self.PIECES.index(piece) if piece in self.PIECES else None

    def language_tokens(self):
        return ['__eng__']

    def copy_to(self, directory):
        pass


def test_the_pipeline_pads_with_the_vocabularys_pad_and_ends_with_its_eos():
    """Evaluation batches and packed training rows of a vocabulary whose pad is 1 and eos 2:
    every example ends with 2, padding and filler targets are 1, a filler source is [2]; the
    id 0 is a token like any other (here, <s> where text holds it)."""
    from transformer.data import tokenized

    toy = ToyVocabulary()
    assert isinstance(toy, data.Vocabulary)
    sources, targets = ['ze bland', 'robop', '<s> pud ze zorp'], ['bland', 'pud ze', 'ze']
    evaluation = data.eval_set_of_lines(toy, sources, targets, batch_size=4, name='toy')
    (batch,) = evaluation.batches
    rows = batch['index'] >= 0
    for key, texts in (('inputs', sources), ('targets', targets)):
        for row, i in enumerate(batch['index'][rows]):
            ids = toy.encode(texts[i]) + [2]
            assert batch[key][row].tolist() == ids + [1] * (batch[key].shape[1] - len(ids))
    assert batch['inputs'][~rows].tolist() == [[2] + [1] * (batch['inputs'].shape[1] - 1)]
    assert (batch['targets'][~rows] == 1).all()
    assert toy.decode(batch['targets'][0]) == targets[batch['index'][0]]

    split = tokenized.TokenizedSplit(
        *tokenized.encode_texts(toy, sources, 'source'),
        *tokenized.encode_texts(toy, targets, 'target'),
    )
    iterator = data.TrainIterator(split, batch_size=2, seed=0, max_len=8, special=toy.special)
    packed = next(iterator)
    for side in ('inputs', 'targets'):
        tokens, segments = packed[side], packed[f'{side}_segmentation']
        assert (tokens[segments == 0] == 1).all() and (segments == 0).any()
        ends = (segments > 0) & (np.roll(segments, -1, axis=1) != segments)
        assert (tokens[ends] == 2).all() and ends.sum() == 3


def test_a_new_run_whose_ids_are_not_its_vocabularys_stops_before_writing(tmp_path):
    """A run from scratch trains a joint SentencePiece vocabulary: other recorded ids stop it
    in one line, before the workdir, the vocabulary or config.json exist."""
    from transformer.training import workdir_checks

    config = schema.parse(_with_ids(tiny_run_config(1), NLLB_LIKE))
    workdir = tmp_path / 'new'
    with pytest.raises(
        data.DataError,
        match=r'The vocabulary of the run has the special ids pad_id=0 .* records pad_id=1',
    ) as info:
        workdir_checks.before_writing(config, str(workdir))
    assert '\n' not in str(info.value) and not workdir.exists()
    workdir_checks.before_writing(schema.parse(tiny_run_config(1)), str(workdir))  # the joint ids
