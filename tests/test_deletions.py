"""No command deletes what it did not write (docs/reliability.md, "What each command may delete").

`export --overwrite` replaced whatever --out held: another run's checkpoints, the run being
exported itself, a directory above it, a pretrained model. Each is now refused in one line
with every file as it was (the hashes of the whole tree before and after); the export of a
run that has checkpoints is used, so that the command, without the refusal, would have gone
on to write. An output flag (translate's --output, visualize's --out, evaluate's --output and
the scores it writes beside it) never replaces a file of a run or of a model directory.
"""

import importlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.file_tree import tree_hashes
from transformer import export


def _copy_run(run_dir, destination: Path) -> Path:
    """A copy of the session's trained run (a test may lose it; the session's is shared)."""
    shutil.copytree(run_dir, destination, ignore=shutil.ignore_patterns('*.lock'))
    return destination


def _export_cli(*args) -> str:
    with pytest.raises(SystemExit) as info:
        export.cli(['export', *args])
    return info.value.code


def _marian_copy(tmp_path_factory, destination: Path) -> Path:
    pytest.importorskip('transformers', reason="pip install -e '.[export]'")
    from tests.marian_dir import marian_dir

    shutil.copytree(marian_dir(tmp_path_factory), destination)
    return destination


@pytest.mark.parametrize(
    'case, words',
    [
        ('another run', 'is a run directory'),
        ('the run itself', 'is the run being exported'),
        ('a parent of the run', 'holds the run being exported'),
        ('a MarianMT directory', "config.json of model_type 'marian'"),
        ('a directory of other files', 'holds no export of this project'),
    ],
)
def test_export_overwrite_refuses_what_no_export_wrote(
    case, words, run_dir, tmp_path, tmp_path_factory
):
    """--overwrite replaces an earlier export only: another run, the run itself, a directory
    above it, a pretrained model and other files are refused in one line, exit 1, with every
    file under tmp_path (the run, --out, their parent) as it was and no staging left."""
    run = _copy_run(run_dir, tmp_path / 'parent' / 'run')
    out = {
        'another run': lambda: _copy_run(run_dir, tmp_path / 'other_run'),
        'the run itself': lambda: run,
        'a parent of the run': lambda: tmp_path / 'parent',
        'a MarianMT directory': lambda: _marian_copy(tmp_path_factory, tmp_path / 'opus-mt'),
        'a directory of other files': lambda: tmp_path / 'notes',
    }[case]()
    if case == 'a directory of other files':
        (out / 'sub').mkdir(parents=True)
        (out / 'notes.txt').write_text('mine\n')
        (out / 'sub' / 'data.bin').write_bytes(os.urandom(64))
    before = tree_hashes(tmp_path)
    message = _export_cli(f'--workdir={run}', f'--out={out}', '--overwrite')
    assert message.startswith('error: ') and '\n' not in message, message
    assert words in message and str(out) in message, message
    assert tree_hashes(tmp_path) == before


def test_translate_and_visualize_never_replace_a_file_of_a_run(run_dir, tmp_path, capsys):
    """`translate --output RUN/config.json` wrote the translations over the run's config, and
    `visualize --out` over any file it was given; a file of a run (its config, anything in
    vocab/ or checkpoints/) is refused in one usage line (exit 2) before the model loads. A
    new file in a run directory, or one in its eval/, is written as before."""
    run = _copy_run(run_dir, tmp_path / 'run')
    (tmp_path / 'in.txt').write_text('a b\n')
    (run / 'vocab' / 'attention.png').write_bytes(b'not an image of ours')
    cases = [
        ('translate', [f'--input={tmp_path / "in.txt"}', f'--output={run / "config.json"}']),
        ('visualize', ['--text=a b', f'--out={run / "vocab" / "attention.png"}']),
    ]
    before = tree_hashes(tmp_path)
    for command, flags in cases:
        cli = importlib.import_module(f'transformer.{command}').cli
        with pytest.raises(SystemExit) as info:
            cli([command, f'--workdir={run}', *flags])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f'is a file of the run {run}' in err[0], err
    assert tree_hashes(tmp_path) == before


def test_evaluate_scores_never_replace_a_json_that_is_not_evaluates(run_dir, tmp_path, capsys):
    """`evaluate --output hyps.txt` writes its scores to hyps.json: a hyps.json of someone
    else's was replaced, and `--output scores.json` had its hypotheses replaced by the scores.
    Both are one usage line before the model loads (and one `error:` line from the Python
    API, before the decode); a hyps.json of evaluate's own is replaced as before."""
    from transformer import evaluate

    mine = tmp_path / 'hyps.json'
    mine.write_text(json.dumps({'bleu': 'my notes'}))
    before = tree_hashes(tmp_path)
    for output, words in ((tmp_path / 'hyps.txt', 'holds no scores of evaluate'),
                          (tmp_path / 'new.json', 'ends in .json')):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            evaluate.cli(['evaluate', f'--workdir={run_dir}', f'--output={output}'])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    from transformer.rundir import WorkdirError

    with pytest.raises(WorkdirError, match='holds no scores of evaluate'):
        evaluate.run(str(run_dir), output=str(tmp_path / 'hyps.txt'), max_examples=2)
    assert tree_hashes(tmp_path) == before
    from transformer.commands import ownership

    mine.write_text(json.dumps({'sacrebleu': 1.0}))  # an earlier evaluate's scores: replaced
    assert ownership.scores_refusal(str(tmp_path / 'hyps.txt')) is None


def test_an_output_may_replace_the_users_files_but_no_file_of_a_model_or_an_export(tmp_path):
    """What `output_refusal` lets an output flag replace: a new file, a file of the user's
    (also one beside a model's files, or in a run's eval/ or under a new name in a run), not
    a model's own file (config, weights, vocabulary) nor one that an export's mark lists."""
    from tests.tiny_run import run_dir_with
    from transformer.commands import ownership

    model = tmp_path / 'opus-mt'
    model.mkdir()
    (model / 'config.json').write_text(json.dumps({'model_type': 'marian'}))
    for name in ('model.safetensors', 'source.spm', 'vocab.json', 'notes.txt'):
        (model / name).write_text('x')
    export_dir = tmp_path / 'export'
    export_dir.mkdir()
    (export_dir / 'model.bin').write_text('x')
    (export_dir / 'hyps.txt').write_text('x')
    ownership.export_mark('ctranslate2', 'run', [4], None).write(str(export_dir))
    (export_dir / 'later.txt').write_text('x')
    run, _ = run_dir_with(tmp_path)
    (run / 'eval').mkdir()
    for name in ('eval/test-4.txt', 'translations.txt', 'metrics.jsonl'):
        (run / name).write_text('x')
    refused = {
        str(path.relative_to(tmp_path))
        for path in tmp_path.rglob('*')
        if ownership.output_refusal(str(path))
    }
    assert refused == {
        *('opus-mt/config.json', 'opus-mt/model.safetensors', 'opus-mt/source.spm'),
        *('opus-mt/vocab.json', 'export/model.bin', 'export/hyps.txt'),
        'export/transformer_export.json',
        *('run/config.json', 'run/vocab/spm.model', 'run/metrics.jsonl'),
    }
    assert ownership.output_refusal(str(tmp_path / 'opus-mt' / 'new.txt')) is None
