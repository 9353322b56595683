"""What a command may replace: only what it wrote (docs/reliability.md, "What each command may
delete").

`export --overwrite` replaces a directory only when an export of this project wrote it: the
export's mark (`EXPORT_MARK_FILE`, a JSON naming the format, the run and the steps) lists every
file it wrote, and the directory holds nothing else. It refuses the run being exported, a
directory above it, any run directory (`is_run`), a model directory it did not write and any
other non-empty directory (`export_refusal`). An output flag (``--output``, ``--out``) never
replaces a file of a run, of a model directory or of an export (`output_refusal`), and
evaluate's scores never replace a JSON file that is not evaluate's (`scores_refusal`). Each
refusal is one line, given before anything is read or written.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Sequence

from transformer import files, rundir

EXPORT_MARK_FILE = 'transformer_export.json'
EXPORT_MARK = files.Mark(EXPORT_MARK_FILE, 'transformer.export')

# What a run directory holds besides config.json (`rundir.RUN_ENTRIES`): any one of them
# beside config.json, or checkpoints/ or best/ alone (a run whose config.json is lost), makes a
# directory a run's.
RUN_PATHS = tuple(name for name in rundir.RUN_ENTRIES if name != rundir.CONFIG_FILE)


def export_mark(format: str, workdir: str, steps: Sequence[int], quantization: str | None):
    """The mark an export writes: its format, the run and the checkpoint steps it holds."""
    details = {'format': format, 'quantization': quantization, 'workdir': os.path.abspath(workdir)}
    return dataclasses.replace(EXPORT_MARK, details={**details, 'steps': [int(s) for s in steps]})


def is_run(directory: str) -> bool:
    """Whether ``directory`` holds a run (`RUN_PATHS`)."""
    if not os.path.isdir(directory):
        return False
    names = set(os.listdir(directory))
    if rundir.CHECKPOINTS in names or rundir.BEST in names:
        return True
    return rundir.CONFIG_FILE in names and bool(names & set(RUN_PATHS))


def run_of(file: str) -> str | None:
    """The run whose own files include ``file`` (config.json, its history, metrics and lock,
    anything under its checkpoints, vocabulary or token cache), else None. WORKDIR/eval/
    (evaluate's outputs) and new names a user puts in a run are not its own."""
    parts = os.path.abspath(file).split(os.sep)
    for depth in range(len(parts) - 1, 0, -1):
        inside = parts[depth]
        own = inside in (*RUN_PATHS, rundir.CONFIG_FILE) and inside != rundir.EVAL_DIR
        directory = os.sep.join(parts[:depth]) or os.sep
        if own and is_run(directory):
            return directory
    return None


def model_files(directory: str) -> str | None:
    """What makes ``directory`` a model's (a config.json naming a ``model_type``, weights), in
    words; None when it holds neither."""
    found = []
    try:
        with open(os.path.join(directory, rundir.CONFIG_FILE), encoding='utf-8') as f:
            model_type = json.load(f).get('model_type')
        if model_type:
            found.append(f'config.json of model_type {model_type!r}')
    except (OSError, ValueError, AttributeError):
        pass
    for pattern in rundir.WEIGHT_PATTERNS:
        found += sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, pattern)))
    return ', '.join(found[:3]) or None


def export_refusal(out: str, workdir: str, overwrite: bool) -> str | None:
    """Why ``export`` may not write ``out`` (None: absent, empty, or with ``overwrite`` an
    earlier export of this project holding nothing else); one line."""
    real_out, real_run = os.path.realpath(out), os.path.realpath(workdir)
    fix = 'export into a new or empty directory'
    if real_out == real_run:
        return f'--out {out} is the run being exported: {fix}.'
    if real_run.startswith(real_out.rstrip(os.sep) + os.sep):
        return f'--out {out} holds the run being exported ({workdir}): {fix}.'
    if os.path.islink(out) or (os.path.lexists(out) and not os.path.isdir(out)):
        kind = 'a link' if os.path.islink(out) else 'a file'
        return f'{out} is {kind}; --out names the directory to export into.'
    if not os.path.isdir(out) or not os.listdir(out):
        return None
    if is_run(out):
        held = ', '.join(sorted(set(os.listdir(out)) & {rundir.CONFIG_FILE, *RUN_PATHS})[:3])
        return (
            f'--out {out} is a run directory ({held}): --overwrite replaces only an earlier '
            f'export; {fix}.'
        )
    foreign = EXPORT_MARK.foreign(out)
    if foreign == []:
        mark = EXPORT_MARK.read(out) or {}
        what = f'an earlier export ({mark.get("format")}, steps {mark.get("steps")})'
        return None if overwrite else f'{out} holds {what}; pass --overwrite to replace it.'
    if foreign:
        shown = ', '.join(foreign[:3]) + (f' and {len(foreign) - 3} more' if foreign[3:] else '')
        return (
            f'{out} holds an export and files that no export wrote ({shown}): move them out '
            'of it, or export elsewhere.'
        )
    model = model_files(out)
    if model:
        return (
            f'{out} holds a model ({model}) that no export of this project wrote (no '
            f'{EXPORT_MARK_FILE}): --overwrite replaces only an earlier export; {fix} (an '
            'export of a version before the mark: remove it yourself).'
        )
    return f'{out} is not empty and holds no export of this project (no {EXPORT_MARK_FILE}): {fix}.'


def output_refusal(file: str) -> str | None:
    """Why an output flag may not write ``file`` (None: it may: a new file, or one of the
    user's): an existing file of a run (`run_of`), one an export lists in its mark, or a
    model's own file (`rundir.is_model_file`) in a model directory (`model_files`)."""
    if not os.path.lexists(file) or os.path.isdir(file):
        return None
    run = run_of(file)
    if run:
        return f'{file} is a file of the run {run}; an output never replaces one: name another.'
    directory, name = os.path.split(os.path.abspath(file))
    mark = EXPORT_MARK.read(directory)
    if mark:
        model = 'an export' if name in (*mark['files'], EXPORT_MARK_FILE) else None
    else:
        model = model_files(directory)
        model = model if rundir.is_model_file(name) else None
    if model:
        return (
            f'{file} is a file of the model directory {directory} ({model}); an output never '
            'replaces one: name another.'
        )
    return None


def scores_refusal(hypotheses: str) -> str | None:
    """Why evaluate may not write its hypotheses to ``hypotheses`` and its scores beside them
    (the same name, ``.json``): a name that ends in .json (the scores would replace the
    hypotheses), a file of a run or a model (`output_refusal`), or a JSON file there that
    holds no scores of evaluate."""
    scores = os.path.splitext(hypotheses)[0] + '.json'
    if os.path.abspath(scores) == os.path.abspath(hypotheses):
        return (
            f'{hypotheses} ends in .json, where the scores go: name the hypotheses file '
            'otherwise (.txt).'
        )
    refusal = output_refusal(hypotheses) or output_refusal(scores)
    if refusal or not os.path.lexists(scores):
        return refusal
    try:
        with open(scores, encoding='utf-8') as f:
            value = json.load(f)
        mine = isinstance(value, dict) and 'sacrebleu' in value
    except (OSError, ValueError):
        mine = False
    if not mine:
        return (
            f'{scores}, where the scores of {hypotheses} go, holds no scores of evaluate: move '
            'it, or name the hypotheses file otherwise.'
        )
    return None
