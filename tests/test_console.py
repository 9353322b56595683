"""Command-line plumbing: a quiet terminal by default, --verbosity, configs found by name, and
a core that never imports TensorFlow."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tests.subprocess_env import repo_env, xla_flags
from transformer import configs
from transformer.commands import console, library_logs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the quiet console must keep off the terminal (one fragment of each line in NOISE).
NOISE_FRAGMENTS = (
    "Unable to initialize backend 'tpu'",
    'read_only=True, setting',
    'Given directory is read only',
    'If you insist your data is detokenized',
    'load_module',
)


def _python(code, cwd, *args):
    env = repo_env(JAX_PLATFORMS='', XLA_FLAGS=xla_flags(1))  # one CPU device: faster to start
    return subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_quiet_filter_keeps_warnings_drops_listed_noise_and_library_info():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger('sacrebleu')
    handler = Keep()
    handler.addFilter(library_logs._FILTER)
    logger.addHandler(handler)
    kept = []
    handler.emit = lambda record: (records.append(record.getMessage()), kept.append(record))
    try:
        logger.warning('If you insist your data is detokenized, or do not care, ...')
        logger.warning('A warning someone should read.')
        logger.info('Library chatter.')
        try:
            raise ValueError('disk full')
        except ValueError:
            logger.exception('A save failed.')  # shown, on one line: without its traceback
        logging.getLogger('asyncio').addHandler(handler)
        logging.getLogger('asyncio').error('Task exception was never retrieved\nfuture: <...>')
    finally:
        logger.removeHandler(handler)
        logging.getLogger('asyncio').removeHandler(handler)
    assert records == ['A warning someone should read.', 'A save failed.']
    assert kept[1].exc_info is None and kept[1].exc_text is None


def test_quiet_unraisable_hook_drops_only_closed_event_loops(capsys):
    """Tensorstore's 'Event loop is closed' after a failed Orbax save is dropped; any other
    unraisable exception is printed as Python prints it."""

    class RaisesWhenCollected:
        def __init__(self, message):
            self.message = message

        def __del__(self):
            raise RuntimeError(self.message)

    previous, sys.unraisablehook = sys.unraisablehook, library_logs._quiet_unraisable
    try:
        RaisesWhenCollected('Event loop is closed')
        assert capsys.readouterr().err == ''
        RaisesWhenCollected('something else')
        assert 'RuntimeError: something else' in capsys.readouterr().err
    finally:
        sys.unraisablehook = previous


def test_argv_verbosity():
    assert console.argv_verbosity(['--workdir=x']) == 0
    assert console.argv_verbosity(['--verbosity=1']) == 1
    assert console.argv_verbosity(['-v', '2']) == 2
    assert console.argv_verbosity(['--verbosity', '-1']) == -1


def test_config_by_name_or_path():
    """--config base names the packaged file; paths (and the configs/ shims) stay paths."""
    assert configs.names() == ['base', 'big', 'multi30k', 'tiny']
    resolved = console.resolve_config_arg(['t', '--config', 'tiny', '--config=base:x'])
    assert resolved == ['t', '--config', configs.path('tiny'), f'--config={configs.path("base")}:x']
    assert console.resolve_config_arg(['t', '--config=configs/base.py']) == [
        't',
        '--config=configs/base.py',
    ]
    names = ', '.join(configs.names())  # the list asserted above
    with pytest.raises(Exception, match=f'packaged configs are {names}'):
        console.resolve_config_arg(['t', '--config', 'nosuch'])


# One process for the three checks (each process starts jax and compiles the search again).
# It evaluates conftest's run first at the default verbosity, then with --verbosity=1, each
# after a marker line on stderr, jax's backend first started inside the quiet one; then it
# trains, evaluates, translates and reads text files, and prints the TensorFlow modules loaded.
_CORE_RUN = """
import json, sys
from transformer import evaluate

def evaluate_command(*flags):
    print(MARKER, file=sys.stderr, flush=True)
    try:
        evaluate.cli(['evaluate', *sys.argv[1:], *flags])
    except SystemExit as e:
        assert not e.code, e.code

evaluate_command()
evaluate_command('--verbosity=1')
print(MARKER, file=sys.stderr, flush=True)

from transformer import data, schema
from transformer.commands import train as trainer
from transformer.checkpoint import load_model
from transformer.decoding import DecodeOptions, translation
from tests.tiny_run import tiny_run_config

config = tiny_run_config(2)
config.eval.bleu_every = 2
config.eval.bleu_max_examples = 3
config.eval.beam_size = 2
trainer.train_and_evaluate(config, 'run')
evaluate.run('run', beam_size=2, max_examples=3, output='hyps.txt')
_, tokenizer, model, params, _ = load_model('run')
translation.translate_lines(['a b c'], tokenizer, model, params, beam_size=2,
                            options=DecodeOptions(5), batch_size=2, max_input_tokens=16, nbest=2)
for name in ('train.en', 'train.de', 'val.en', 'val.de', 'test2016.en', 'test2016.de'):
    open(name, 'w').write('a b\\n')
folder = schema.default_config().data
folder.update(dataset='folder', folder='.')
multi30k = schema.default_config().data
multi30k.update(dataset='multi30k', manual_dir='.')
data.load_text(folder, 'train'), data.load_text(multi30k, 'test2016')
tf = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets'))
print(json.dumps(tf))
"""
_MARKER = '--- next part ---'


@pytest.mark.slow
def test_core_never_imports_tensorflow_and_prints_no_library_noise(run_dir, tmp_path):
    """`evaluate` prints none of the libraries' noise (and loads a run saved on another
    number of devices), and --verbosity=1 brings the noise back; training (with TensorBoard
    events and validation BLEU), evaluating and translating on synthetic data, and reading
    folder and Multi30k files, import neither TensorFlow nor TFDS (the evaluate command's
    imports included)."""
    # run_dir was trained on 8 (simulated) devices, and is evaluated here on one.
    args = (f'--workdir={run_dir}', '--max_examples=3', '--beam_size=2', '--output=h.txt')
    done = _python(f'MARKER = {_MARKER!r}\n{_CORE_RUN}', tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    before, quiet, verbose, _ = done.stderr.split(_MARKER + '\n')
    quiet = before + quiet  # the process's stderr up to the verbose command
    assert 'Evaluating' in quiet  # our own progress lines stay
    assert not [f for f in NOISE_FRAGMENTS if f in quiet], quiet
    assert 'Given directory is read only' in verbose, verbose
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert list((tmp_path / 'run' / 'tensorboard').iterdir())


def test_out_of_memory_line_words_xla_errors_and_leaves_others():
    """XLA's CPU and GPU wordings (as jaxlib raises them) become one line with the size in
    GiB and the command's hint; any other runtime error is not an out-of-memory one."""
    cpu = RuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 39711699328 bytes.')
    assert console.out_of_memory_line(cpu, 'Lower X.') == (
        'out of memory allocating 39711699328 bytes (37.0 GiB). Lower X.'
    )
    dispatch = RuntimeError(
        'INTERNAL: Error dispatching computation: Error dispatching computation: Out of '
        'memory allocating 2147483648 bytes.'
    )
    assert console.out_of_memory_line(dispatch, 'Lower X.') == (
        'out of memory allocating 2147483648 bytes (2.0 GiB). Lower X.'
    )
    gpu = RuntimeError(
        'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.\n'
        'BufferAssignment OOM Debugging.'
    )
    assert console.out_of_memory_line(gpu, '') == (
        'out of memory while trying to allocate 1073741824 bytes (1.0 GiB).'
    )
    assert console.out_of_memory_line(RuntimeError('INTERNAL: something else'), 'h') is None
    busy = RuntimeError('RESOURCE_EXHAUSTED: too many pending requests')  # not memory
    assert console.out_of_memory_line(busy, 'h') is None


@pytest.mark.parametrize(
    'command, flag, message',
    [
        ('evaluate', '--beam_size=0', '0 is not a positive integer'),
        ('evaluate', '--average_last=-1', '-1 is not a positive integer'),
        ('evaluate', '--max_examples=-5', '-5 is not a non-negative integer'),
        ('translate', '--batch_size=-1', '-1 is not a positive integer'),
        ('translate', '--alpha=-1', '-1.0 is not a non-negative number'),
        ('translate', '--nbest=-1', '-1 is not a non-negative integer'),
        ('translate', '--max_input_tokens=1', '1 is not integer >= 2'),
        ('export', '--average_last=0', '0 is not a positive integer'),
    ],
)
def test_decoding_flags_out_of_range_are_one_line_exit_2(command, flag, message, tmp_path, capsys):
    """Values no search can use (a beam of 0, a negative batch, average_last < 1 ...) stop
    the command before it loads anything, in one line naming the flag (they used to run into
    tracebacks or, for a negative --average_last, silently average the wrong checkpoints)."""
    import importlib

    cli = importlib.import_module(f'transformer.{command}').cli
    with pytest.raises(SystemExit) as info:
        out = [f'--out={tmp_path / "out"}'] if command == 'export' else []
        cli([command, f'--workdir={tmp_path}', *out, flag])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f'error: flag {flag}: {message}'], err


@pytest.mark.parametrize(
    'command, flag, message',
    [
        ('translate', '--input={tmp}/missing.txt', 'no readable file there.'),
        ('translate', '--input={tmp}', 'no readable file there.'),
        ('translate', '--output={tmp}/no/out.txt', 'the directory {tmp}/no does not exist.'),
        ('translate', '--output={tmp}', 'is a directory; give a file path.'),
        ('evaluate', '--output={tmp}/no/hyps.txt', 'the directory {tmp}/no does not exist.'),
        ('visualize', '--out={tmp}/no/a.png', 'the directory {tmp}/no does not exist.'),
    ],
)
def test_unusable_input_or_output_paths_stop_before_any_work(
    command, flag, message, tmp_path, capsys
):
    """An input that cannot be read or an output that could not be written is one usage
    line (exit code 2) before the model is loaded, not a traceback after the decoding."""
    import importlib

    cli = importlib.import_module(f'transformer.{command}').cli
    flag, message = flag.format(tmp=tmp_path), message.format(tmp=tmp_path)
    with pytest.raises(SystemExit) as info:
        text = ['--text=a b'] if command == 'visualize' else []
        cli([command, f'--workdir={tmp_path}', *text, flag])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f'error: {flag}') and err[0].endswith(message), err


def test_command_line_mistakes_are_one_usage_line(tmp_path, monkeypatch, capsys):
    """A missing required flag, a stray argument, a config path that does not exist and a
    config file that does not load: one `error:` line, exit code 2 (they printed the module
    docstring with exit code 1, or tracebacks)."""
    from transformer import evaluate
    from transformer.commands import train as trainer

    bad = tmp_path / 'bad.py'
    bad.write_text('def get_config(:\n    pass\n')
    cases = [
        (evaluate.cli, ['evaluate'], 'error: --workdir is required.'),
        (
            evaluate.cli,
            ['evaluate', f'--workdir={tmp_path}', 'stray'],
            "error: Unexpected arguments: ['stray'] (every option is a --flag).",
        ),
        (
            trainer.cli,
            ['train.py', f'--config={tmp_path}/none.py', f'--workdir={tmp_path}/run'],
            f'error: --config {tmp_path}/none.py: no such file.',
        ),
        (
            trainer.cli,
            ['train.py', f'--config={bad}', f'--workdir={tmp_path}/run'],
            'error: invalid syntax (bad.py, line 1)',
        ),
        (
            trainer.cli,
            ['train.py', f'--config={REPO}/configs/tinyy.py', f'--workdir={tmp_path}/run'],
            f'error: --config {REPO}/configs/tinyy.py: no such file; did you mean '
            f'{REPO}/configs/tiny.py?',
        ),
        (
            trainer.cli,
            ['train.py', '--config=multi30k_tinyy', f'--workdir={tmp_path}/run'],
            'error: --config multi30k_tinyy: no such file, and the packaged configs are '
            f'{", ".join(configs.names())}. Did you mean multi30k?',
        ),
        (
            trainer.cli,
            ['train.py', '--config=tiny', f'--workdir={tmp_path}/run', '--model.d_model=8'],
            "error: Unknown command line flag 'model.d_model'; did you mean "
            '--config.model.d_model?',
        ),
    ]
    for cli, argv, line in cases:
        monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its flags from sys.argv
        with pytest.raises(SystemExit) as info:
            cli(argv)
        assert info.value.code == 2, argv
        assert capsys.readouterr().err.strip().splitlines() == [line]
    assert not (tmp_path / 'run').exists()


def test_ctrl_c_in_a_command_is_one_line_exit_130(tmp_path):
    """SIGINT while a command's main runs (translate waiting on stdin, evaluate decoding):
    'Interrupted.' and exit code 130, no KeyboardInterrupt traceback."""
    import signal

    code = textwrap.dedent(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
        from transformer.commands import console

        def main(argv):
            print('in main', flush=True)
            time.sleep(60)

        console.run(main, ['command'])
        """
    )
    env = repo_env()
    proc = subprocess.Popen(
        [sys.executable, '-c', code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == 'in main'
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == 'Interrupted.' and 'Traceback' not in err


@pytest.mark.parametrize(
    'command', ['commands.train', 'evaluate', 'translate', 'score', 'visualize', 'export']
)
@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_the_command_flags_and_config_fields_and_exits_0(command, flag, capsys):
    """`-h` / `--help`: the command's own flags with their defaults (none of absl's), and for
    the train command every config field with its value and its comment; exit code 0."""
    import importlib

    cli = importlib.import_module(f'transformer.{command}').cli
    with pytest.raises(SystemExit) as info:
        cli([command, flag])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert '  --workdir (default: None)' in out
    assert '--helpfull' in out and '--flagfile' not in out and '--verbosity' not in out
    if command == 'commands.train':
        assert '  model.d_model = 512  # D (Table 3, base)' in out
        assert "  opt.warmup_steps = 4000  # steps of the schedule's linear warm-up\n" in out
    else:  # the evaluation settings it reads from the run's config.json
        assert 'config fields' not in out
        assert '  eval.beam_size = 4  # Sec. 6.1' in out
        assert 'model.d_model' not in out  # only with --helpfull


def test_help_shows_the_fields_of_the_chosen_variant(capsys):
    """`--config FILE:VARIANT --help` lists that variant's values, not the file's default."""
    from transformer.commands import train

    with pytest.raises(SystemExit) as info:
        train.cli(['train', '--config', 'configs/multi30k.py:tiny_fairseq', '--help'])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert 'from configs/multi30k.py:tiny_fairseq:' in out
    assert '  model.d_model = 128  #' in out and "  data.pretokenize = 'moses'  #" in out


@pytest.mark.parametrize('command', ['commands.train', 'evaluate', 'translate'])
def test_helpfull_adds_every_section_with_the_schema_descriptions_and_every_flag(command, capsys):
    import importlib

    from transformer import schema

    cli = importlib.import_module(f'transformer.{command}').cli
    with pytest.raises(SystemExit) as info:
        cli([command, '--helpfull'])
    assert info.value.code == 0
    out = capsys.readouterr().out
    descriptions = schema.descriptions()
    for key, value in (('model.d_model', 512), ('train.init_timeout_s', 60), ('eval.alpha', 0.6)):
        assert f'  {key} = {value!r}  # {descriptions[key]}\n' in out
    assert '--flagfile' in out and '--verbosity' in out  # absl's flags too


def test_help_describes_fields_from_the_schema_not_the_config_files_comments(capsys):
    from transformer import schema
    from transformer.commands import train

    with pytest.raises(SystemExit):
        train.cli(['train', '--config=tiny', '--help'])
    out = capsys.readouterr().out
    # tiny.py's comment on this line says why it is 0; the schema says what the field is.
    line = f'  model.dropout_rate = 0.0  # {schema.descriptions()["model.dropout_rate"]}\n'
    assert line in out and 'noise-free' not in out


def test_a_shared_flag_takes_the_default_of_the_command_that_defines_it_again():
    """Commands of one process share flags: export's --out (None) then visualize's
    ('attention.png'); the second command gets its own default, not the first one's."""
    from absl import flags

    try:
        console.define_flag('shared_probe', flags.DEFINE_string, None, 'the first command')
        console.define_flag('shared_probe', flags.DEFINE_string, 'a.png', 'the second')
        assert flags.FLAGS['shared_probe'].default == 'a.png'
        assert flags.FLAGS['shared_probe'].value == 'a.png'
    finally:
        delattr(flags.FLAGS, 'shared_probe')
        console._COMMAND_FLAGS.clear()
