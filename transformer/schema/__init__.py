"""The experiment config's schema: one frozen, typed dataclass per section.

Configs are written as ml_collections ConfigDicts (transformer/configs/), which give every
field a ``--config.section.key=value`` override. `parse` turns one into an `Experiment` once,
at the command line, and the run reads only the typed sections: every field's type, range and
choices are checked in the sections' ``__post_init__``, so a value that cannot work stops the
command in one line before anything is written. config.json holds `to_dict` of it, and
`rundir.read_config` parses it back. The model section is the model's own `TransformerConfig`,
whose fields and rules live with the network (transformer/model/config.py) and are checked as
the other sections' are (transformer/fields.py: one way to validate).

Each default is written once: here, on its field (sections.py, eval_section.py; the model's
on TransformerConfig's fields; a data source's own keys in its ``KEYS`` table, with their types
and descriptions), with its type, rule and one-line description (``--help`` prints it).
Not in configs/base.py, because the schema must know a value for every field added after
configs were first written anyway: a run directory's config.json written before the
field existed lacks it, and `complete` fills it in with the value such a run used (an
``optional`` field's default, which therefore never changes). With every default here,
`default_config` is the whole config at its defaults, configs/base.py is that plus the
paper's choices that differ (its WMT14 data), every other config is base plus its own
changes, and the data section's defaults are nowhere else. The defaults are the paper's
base model and training; the data default is the built-in synthetic task (offline).

Every setting that names a file or a directory is stored absolute (paths.py: `PATH_KEYS`,
`absolute_paths`), resolved against the directory the command was given in.

Each choice list is written once, as a ``Literal`` (sections.py, eval_section.py); the modules
that act on a choice import its tuple (``SCHEDULES``, ``DROPOUT_PRNGS``, ...).
"""

from transformer.fields import (
    MAX_INIT_TIMEOUT,
    MAX_SEED,
    MAX_STEP,
    MAX_VOCAB,
    ConfigError,
)
from transformer.schema.convert import (
    Config,
    complete,
    default_config,
    descriptions,
    parse,
    plain,
    to_dict,
)
from transformer.schema.eval_section import EOS_AT_LIMIT, LENGTH_PENALTIES, METRICS, EvalSection
from transformer.schema.paths import PATH_KEYS, absolute, absolute_paths, same_path, split_paths
from transformer.schema.sections import (
    DROPOUT_PRNGS,
    PARALLELISMS,
    REMOVED_KEYS,
    REMOVED_VALUES,
    SCHEDULES,
    SECTIONS,
    DataSection,
    Experiment,
    OptSection,
    TrainSection,
)

__all__ = [
    'DROPOUT_PRNGS',
    'EOS_AT_LIMIT',
    'LENGTH_PENALTIES',
    'MAX_INIT_TIMEOUT',
    'MAX_SEED',
    'MAX_STEP',
    'MAX_VOCAB',
    'METRICS',
    'PARALLELISMS',
    'PATH_KEYS',
    'REMOVED_KEYS',
    'REMOVED_VALUES',
    'SCHEDULES',
    'SECTIONS',
    'Config',
    'ConfigError',
    'DataSection',
    'EvalSection',
    'Experiment',
    'OptSection',
    'TrainSection',
    'absolute',
    'absolute_paths',
    'complete',
    'default_config',
    'descriptions',
    'parse',
    'plain',
    'same_path',
    'split_paths',
    'to_dict',
]
