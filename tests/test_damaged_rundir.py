"""A damaged run directory gets one line naming the file (and the line and key), from every
command that reads it (train resuming, evaluate, translate, visualize, export), and nothing
is written into it.

`DAMAGES` is a table anyone can extend: a damage done to a copy of the shared tiny run
(`run_dir`, tests/conftest.py) and a piece of the line each command must then give.
"""

import importlib.util
import json
import os
import shutil
import sys

import pytest
from absl import flags

from tests.tiny_run import SMALL, command_line
from transformer import evaluate, export, rundir, translate, visualize
from transformer.commands import train as trainer

HISTORY = rundir.HISTORY_FILE
CONFIG = rundir.CONFIG_FILE


def _append(name: str, text: str):
    def damage(workdir):
        with open(os.path.join(workdir, name), 'a') as f:
            f.write(text)

    return damage


def _replace(name: str, text: str | bytes):
    def damage(workdir):
        mode = 'wb' if isinstance(text, bytes) else 'w'
        with open(os.path.join(workdir, name), mode) as f:
            f.write(text)

    return damage


def _set(key: str, value):
    """config.json with ``key`` set to ``value`` (written as Python's json writes NaN)."""

    def damage(workdir):
        file = os.path.join(workdir, CONFIG)
        with open(file) as f:
            values = json.load(f)
        section, name = key.split('.', 1)
        values[section] = value if name == '*' else {**values[section], name: value}
        with open(file, 'w') as f:
            json.dump(values, f)

    return damage


def _remove(name: str):
    return lambda workdir: os.remove(os.path.join(workdir, name))


def _swap_kind(name: str):
    """A file where the run keeps the directory ``name``, or a directory for the file."""

    def damage(workdir):
        file = os.path.join(workdir, name)
        if os.path.isdir(file):
            shutil.rmtree(file)
            open(file, 'w').close()
        else:
            if os.path.exists(file):
                os.remove(file)
            os.mkdir(file)

    return damage


def _link_to_nothing(name: str):
    """The directory ``name`` moved to a disk that is not mounted, a link left in its place."""

    def damage(workdir):
        shutil.rmtree(os.path.join(workdir, name))
        os.symlink(os.path.join(workdir, 'unmounted', name), os.path.join(workdir, name))

    return damage


# (id, damage, what every command's one line must say)
DAMAGES = [
    ('history garbage', _append(HISTORY, 'garbage\n'), f'{HISTORY}, line 1 is not valid JSON'),
    (
        'history truncated',
        _append(
            HISTORY, '{"step": 2, "key": "eval.alpha", "old": 0.6, "new": 1.0}\n{"step": 4, "k'
        ),
        f'{HISTORY}, line 2 is not valid JSON',
    ),
    ('history null', _append(HISTORY, 'null\n'), f'{HISTORY}, line 1: None is not a change'),
    (
        'history NaN',
        _append(HISTORY, '{"step": 2, "key": "eval.alpha", "old": 0.6, "new": NaN}\n'),
        f'{HISTORY}, line 1: eval.alpha=nan must be a finite number.',
    ),
    (
        'history mistyped',
        _append(HISTORY, '{"step": 2, "key": "train.num_steps", "old": 4, "new": "x"}\n'),
        f"{HISTORY}, line 1: train.num_steps='x' must be of type int.",
    ),
    (
        'history unknown key',
        _append(HISTORY, '{"step": 2, "key": "nosuch.alpha", "old": 1, "new": 2}\n'),
        f'{HISTORY}, line 1: key nosuch.alpha names no config setting',
    ),
    ('config list', _replace(CONFIG, '[]'), f'{CONFIG}: the config is [], not a mapping'),
    ('config truncated', _replace(CONFIG, '{"model": {'), f'{CONFIG} is not valid JSON'),
    ('config binary', _replace(CONFIG, b'\xff\xfe\x00'), f'{CONFIG} cannot be read'),
    ('config eval null', _set('eval.*', None), f'{CONFIG}: config section eval is None'),
    ('config eval missing key', _set('eval.*', {}), f'{CONFIG}: config key eval.beam_size is'),
    ('config NaN', _set('model.layer_norm_epsilon', float('nan')), 'layer_norm_epsilon=nan'),
    ('config Infinity', _set('eval.alpha', float('inf')), f'{CONFIG}: eval.alpha=inf must be'),
    ('config mistyped', _set('model.d_model', 'abc'), f"{CONFIG}: model.d_model='abc' must be"),
    ('config bool', _set('train.batch_size', True), f'{CONFIG}: train.batch_size=True must be'),
    ('config synthetic null', _set('data.synthetic', None), f'{CONFIG}: data.synthetic=None'),
    ('config bad split', _set('data.test_split', 'x'), "no split 'x' (data.test_split)"),
    ('config unknown key', _set('train.num_stpes', 4), f'{CONFIG}: unknown config key train.num'),
    # A train resume took these for "no checkpoints yet" and started the run over.
    ('checkpoints a file', _swap_kind(rundir.CHECKPOINTS), 'checkpoints is a file, not a dir'),
    ('checkpoints linked to nothing', _link_to_nothing(rundir.CHECKPOINTS), 'which does not exist'),
    ('vocabulary empty', _replace(rundir.VOCAB_FILE, b''), 'spm.model is empty; restore the file'),
]
# Damages to what training alone writes into: one line before it writes anything.
TRAIN_DAMAGES = [
    ('tensorboard a file', _swap_kind(rundir.TENSORBOARD), 'tensorboard is a file, not a dir'),
    ('metrics a directory', _swap_kind(rundir.METRICS_FILE), 'metrics.jsonl is a directory'),
    ('history a directory', _swap_kind(HISTORY), 'config_history.jsonl is a directory, not'),
]
# What each command says when config.json is gone: a resume must not start anew.
MISSING_CONFIG = {
    'evaluate': f'{CONFIG} not found',
    'translate': f'{CONFIG} not found',
    'train': f'/{CONFIG}, the settings they were trained with: restore it to resume',
    'visualize': f'{CONFIG} not found',
    'export': f'{CONFIG} not found',
}


@pytest.fixture(autouse=True)
def fresh_overrides(monkeypatch):
    monkeypatch.delitem(sys.modules, 'config_config', raising=False)
    for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)


# Damages a finished run meets when its command runs again (train.num_steps reached).
FINISHED_DAMAGES = [
    ('final metrics garbage', _replace(rundir.FINAL_METRICS_FILE, 'garbage'), 'is not valid JSON'),
    ('final metrics list', _replace(rundir.FINAL_METRICS_FILE, '[]'), 'holds [], not the metrics'),
]


def _argv(command: str, workdir, tmp_path, num_steps: int = 6, changed=None) -> tuple:
    if command == 'visualize':
        out = f'--out={tmp_path}/attention.png'
        return visualize.cli, ['visualize', f'--workdir={workdir}', '--text=dinds bap .', out]
    if command == 'export':
        return export.cli, ['export', f'--workdir={workdir}', f'--out={tmp_path}/hf']
    if command == 'evaluate':
        return evaluate.cli, ['evaluate', f'--workdir={workdir}', '--max_examples=2']
    if command == 'translate':
        (tmp_path / 'in.txt').write_text('dinds bap koft .\n')
        out = f'--output={tmp_path}/out.txt'
        return translate.cli, [
            'translate',
            f'--workdir={workdir}',
            f'--input={tmp_path}/in.txt',
            out,
        ]
    # The run's own settings (tests/conftest.py's run_dir), two steps further.
    settings = {**SMALL, 'train.num_steps': num_steps, 'train.checkpoint_every': 2}
    settings |= {'train.log_every': 1, 'train.eval_every': 0, 'model.dropout_rate': 0.1}
    settings |= {'train.async_checkpointing': False, 'eval.bleu_every': 0, **(changed or {})}
    flags_ = command_line(settings)
    return trainer.cli, ['train.py', '--config=configs/tiny.py', f'--workdir={workdir}', *flags_]


def _files(workdir) -> dict[str, float]:
    """Each file and its time of change; train.lock aside (the lock is held, and says by whom,
    while the train command reads the run)."""
    found = {
        os.path.relpath(os.path.join(d, f), workdir): os.lstat(os.path.join(d, f)).st_mtime
        for d, _, names in os.walk(workdir)
        for f in names
    }
    found.pop('train.lock', None)
    return found


def _damaged(run_dir, tmp_path, damage):
    workdir = tmp_path / 'run'
    shutil.copytree(run_dir, workdir)
    damage(str(workdir))
    return workdir


def _one_line(command, workdir, tmp_path, monkeypatch, capsys, **settings) -> str:
    cli, argv = _argv(command, workdir, tmp_path, **settings)
    monkeypatch.setattr(sys, 'argv', argv)
    before = _files(workdir)
    with pytest.raises(SystemExit) as info:
        cli(argv)
    code = info.value.code
    assert code not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    if isinstance(code, str):  # SystemExit('error: ...'): Python prints it as the process ends
        err.append(code)
    assert len(err) == 1 and err[0].startswith('error: '), err
    assert _files(workdir) == before  # nothing written, nothing removed
    return err[0]


# The export command reads checkpoints only with its packages (the ``export`` extra), as
# tests/test_export.py; a missing config.json it refuses before asking for them.
_NOT_INSTALLED = [m for m in export.EXTRA_MODULES['hf'] if importlib.util.find_spec(m) is None]
_EXPORT = pytest.param(
    'export',
    marks=pytest.mark.skipif(
        bool(_NOT_INSTALLED),
        reason=f"{', '.join(_NOT_INSTALLED)} not installed: pip install -e '.[export]'",
    ),
    id='export',
)
COMMANDS = ['evaluate', 'translate', 'train', 'visualize', _EXPORT]


@pytest.mark.parametrize('command', COMMANDS)
@pytest.mark.parametrize('name, damage, message', DAMAGES, ids=[d[0] for d in DAMAGES])
def test_a_damaged_run_directory_is_one_line_naming_the_file(
    name, damage, message, command, run_dir, tmp_path, monkeypatch, capsys
):
    workdir = _damaged(run_dir, tmp_path, damage)
    line = _one_line(command, workdir, tmp_path, monkeypatch, capsys)
    assert str(workdir) in line and message in line, line


@pytest.mark.parametrize('name, damage, message', TRAIN_DAMAGES, ids=[d[0] for d in TRAIN_DAMAGES])
def test_a_damaged_path_that_training_writes_into_is_one_line(
    name, damage, message, run_dir, tmp_path, monkeypatch, capsys
):
    workdir = _damaged(run_dir, tmp_path, damage)
    line = _one_line('train', workdir, tmp_path, monkeypatch, capsys)
    assert str(workdir) in line and message in line, line


@pytest.mark.parametrize(
    'name, damage, message', FINISHED_DAMAGES, ids=[d[0] for d in FINISHED_DAMAGES]
)
def test_a_finished_run_with_damaged_final_metrics_is_one_line(
    name, damage, message, run_dir, tmp_path, monkeypatch, capsys
):
    """With a setting a resume may change (its record, config_history.jsonl, is written only
    once every check has passed)."""
    workdir = _damaged(run_dir, tmp_path, damage)
    changed = {'eval.bleu_every': 400}
    line = _one_line('train', workdir, tmp_path, monkeypatch, capsys, num_steps=4, changed=changed)
    assert f'{workdir}/{rundir.FINAL_METRICS_FILE}' in line and message in line, line


@pytest.mark.parametrize('command', sorted(MISSING_CONFIG))
def test_a_missing_config_json_stops_every_command(command, run_dir, tmp_path, monkeypatch, capsys):
    workdir = _damaged(run_dir, tmp_path, _remove(CONFIG))
    line = _one_line(command, workdir, tmp_path, monkeypatch, capsys)
    assert MISSING_CONFIG[command] in line, line


def test_a_run_without_config_json_is_named_so_whatever_else_it_holds(
    run_dir, tmp_path, monkeypatch, capsys
):
    """A file its user put there (an evaluation's output) does not make a run whose
    config.json is gone a directory of foreign files: training names the missing file."""
    workdir = _damaged(run_dir, tmp_path, _remove(CONFIG))
    (workdir / 'notes.txt').write_text('mine\n')
    line = _one_line('train', workdir, tmp_path, monkeypatch, capsys)
    assert MISSING_CONFIG['train'] in line, line


def test_a_resume_without_the_vocabulary_stops(run_dir, tmp_path, monkeypatch, capsys):
    """Training would have made a new vocabulary that does not fit the checkpoints."""
    workdir = _damaged(run_dir, tmp_path, _remove(rundir.VOCAB_FILE))
    line = _one_line('train', workdir, tmp_path, monkeypatch, capsys)
    assert f'holds checkpoints but no {workdir}/{rundir.VOCAB_FILE}' in line, line


@pytest.mark.parametrize('ask', [{}, {'average_last': 2}, {'step': 4}])
def test_a_checkpoint_removed_while_being_read_is_named_and_the_reader_moves_on(
    ask, run_dir, tmp_path, monkeypatch
):
    """A run training in the directory deletes its oldest step between the reader's choice and
    its read: the reader chooses again among the steps that exist; a step asked for by number
    stops in one line that says what happened (it said the checkpoint did not fit the model)."""
    # The race is staged where a read verifies its step, inside the package (not through its
    # public API).
    from transformer.checkpoint import CheckpointRemoved, load_model, loading

    workdir = _damaged(run_dir, tmp_path, lambda w: None)
    real = loading.verify_step
    removed = []

    def verify_after_removal(w, step, *args, **kwargs):
        if not removed:  # the trainer's retention, right under the first read
            removed.append(step)
            shutil.rmtree(rundir.step_dir(w, step))
        return real(w, step, *args, **kwargs)

    monkeypatch.setattr(loading, 'verify_step', verify_after_removal)
    if 'step' in ask:
        with pytest.raises(CheckpointRemoved, match='step 4 .* was removed while being read'):
            load_model(str(workdir), **ask)
        return
    steps = load_model(str(workdir), **ask)[4]
    assert removed and removed[0] not in steps and steps
