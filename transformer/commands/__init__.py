"""The commands, one room above the layers: flags, the console, errors and exit codes.

train.py (``python train.py``, ``transformer-train``), evaluate.py, translate.py,
visualize.py and export.py (``python -m transformer.NAME``, ``transformer-NAME``), each a
``cli()``; console.py, what every command shares (its console, errors, exit codes, the
process-wide settings it opts in to); help.py, ``-h`` / ``--help``.
"""
