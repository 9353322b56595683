"""The commands, one room above the layers: flags, the console, errors and exit codes.

train.py (``python train.py``, ``transformer-train``), evaluate.py, translate.py, score.py,
visualize.py, export.py, convert.py and prepare.py (``python -m transformer.NAME``,
``transformer-NAME``),
each a ``cli()``; console.py, what every command shares (its run, errors, exit codes, the
process-wide settings it opts in to), with library_logs.py (the libraries' log lines at the
console) and shared_flags.py (the flags several commands define); ctranslate2_spec.py,
export's CTranslate2 model, written directly (a pretrained family's own format is written by
transformer/interop/);
help.py, ``-h`` / ``--help``; config_flag.py, the ``--config`` flag's errors in one line;
decoding_run.py, what evaluate, translate and the Python API do before decoding (the
processes joined, the run's layout, its checkpoints restored into it); ownership.py, what a
command may replace (only what it wrote: export's mark, the files of runs and models that no
output replaces).

The modules are this package's public names (``from transformer.commands import train``), imported
when a caller names one: starting one command does not import the others.
"""

__all__ = [
    'config_flag',
    'console',
    'ctranslate2_spec',
    'convert',
    'decoding_run',
    'evaluate',
    'export',
    'library_logs',
    'ownership',
    'prepare',
    'score',
    'shared_flags',
    'train',
    'translate',
    'visualize',
]
