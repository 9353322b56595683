"""Checkpoints on disk, owned here: saving, sealing, verifying, restoring, averaging and the
best checkpoint. Callers use the names below, not the modules behind them:

- the trainer: `Checkpoints` (run.py) saves, seals, resumes (which step: resume.py) and keeps
  the best checkpoint; `RestoreFailed` when no step restores with the run's config;
- the readers (evaluate, translate, visualize, export): `load_model` (loading.py) and the
  steps it would choose (`checkpoint_steps`, `default_average`, `best_step`);
- the converter and fine-tuning (transformer/commands/convert.py, ``train.init_from``): a
  checkpoint of parameters alone (`save_params`; the pretrained directories themselves are
  read by transformer/interop/);
- anyone: `verify_step` (directory.py, with checksums.py's manifest), `read_meta`,
  `average_params`, and the errors `CorruptCheckpoint` and `CheckpointRemoved` (both
  `transformer.rundir.WorkdirError`s, one line each).

Memory. A save or a restore holds at most one float32 copy of the parameters beyond the
train state, the memory check's bound (arrays.py: arrays written uncompressed, read back in
batches).

Integrity. Orbax commits a step atomically (written under a temporary name, then renamed)
but does not checksum the data, so a flipped or truncated file loads silently. Every step
therefore gets ``checkpoints/<step>/manifest.json``: the size and sha256 of each of its
files, written (atomically, by rename) by a thread that waits for Orbax to commit the step
(`Checkpoints.save`), so that no later change to the files can be certified. Every restore
verifies the manifest first; a file that is missing, of another size or another hash
raises `CorruptCheckpoint` naming the step and the file. Training resume falls back to the
newest intact step (moving the corrupt ones to ``corrupt_checkpoints/``, as their step
numbers will be written again) and stops when none is intact.

A step without a manifest is either older than this scheme or was committed by a run
killed in the moment between the commit and its manifest. It is accepted with a one-line
warning rather than refused (refusing would strand every existing run), and never sealed
afterwards: hashing bytes nobody saw written would certify whatever is there. When
training cannot restore such a step it falls back to an older one, as for a corrupt step,
provided the older one restores with the same config (else the config, not the files, is
at fault, and the run stops without moving anything). The other commands never write
manifests: they only read the run directory. Saves killed half-way leave Orbax temporary
directories, which the next training run removes. Paths inside the run directory come from
transformer/rundir.py.
"""

from transformer.checkpoint.directory import (
    CheckpointRemoved,
    CorruptCheckpoint,
    read_meta,
    verify_step,
)
from transformer.checkpoint.loading import (
    average_params,
    best_step,
    checkpoint_steps,
    default_average,
    load_model,
)
from transformer.checkpoint.resume import RestoreFailed
from transformer.checkpoint.run import Checkpoints, save_params

__all__ = [
    'CheckpointRemoved',
    'Checkpoints',
    'CorruptCheckpoint',
    'RestoreFailed',
    'average_params',
    'best_step',
    'checkpoint_steps',
    'default_average',
    'load_model',
    'read_meta',
    'save_params',
    'verify_step',
]
