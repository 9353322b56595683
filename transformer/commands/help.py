"""``-h`` / ``--help`` for every command: its own flags with their defaults and, for a command
that takes ``--config``, every config field with its value and its description from the
schema (transformer/schema/). ``--helpfull`` adds every section of a run's config to the
commands that read one, and then lists every flag, the libraries' included."""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from transformer import configs, run_changes, rundir, schema

HELP_ARGS = ('-h', '--help')
FULL_HELP = '--helpfull'
_BASE = configs.path('base')


def wanted(argv: Sequence[str]) -> bool:
    return any(arg in (*HELP_ARGS, FULL_HELP) for arg in argv[1:])


def _config_lines(
    config_path: str, title: str, sections: Sequence[str] = (), config=None
) -> list[str]:
    """``title`` and a line per field of the config file (or of ``config``, a run's), with
    the field's description from the schema."""
    descriptions = schema.descriptions()
    lines = [title]
    config = configs.load(config_path) if config is None else config
    for key, value in run_changes.flat_config(config).items():
        if sections and key.split('.')[0] not in sections:
            continue
        comment = f'  # {descriptions[key]}' if key in descriptions else ''
        lines.append(f'  {key} = {value!r}{comment}')
    return lines


def text(doc: str, flag_names: Sequence[str], argv: Sequence[str]) -> str:
    """The help of a command: ``doc``'s first paragraph, its flags, its config's fields; with
    ``--helpfull`` a run's every section (not only eval) and then every flag."""
    full = FULL_HELP in argv[1:]
    lines = [(doc or '').strip().split('\n\n')[0], '', 'flags:']
    for name in dict.fromkeys(flag_names):
        flag = flags.FLAGS[name]
        default = '' if name == 'config' else f' (default: {flag.default!r})'
        lines.append(f'  --{name}{default}')
        lines.append(f'      {flag.help}')
    lines.append("  --helpfull: every flag, the libraries' included")
    if 'config' in flag_names:
        chosen = next((a.split('=', 1)[1] for a in argv if a.startswith('--config=')), None)
        if chosen is None and '--config' in argv[:-1]:
            chosen = argv[list(argv).index('--config') + 1]
        path = chosen or _BASE  # with its :VARIANT, which configs.load passes to get_config
        title = f'config fields (override with --config.FIELD=VALUE), from {path}:'
        lines += ['', *_config_lines(path, title)]
    elif 'workdir' in flag_names:
        lines += ['', *_run_lines(_flag_value(argv, 'workdir'), () if full else ('eval',))]
    if full:
        lines += ['', 'every flag:', flags.FLAGS.get_help()]
    return '\n'.join(lines)


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name=V`` or ``--name V`` in ``argv`` (None: not given)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith(f'--{name}='):
            return arg.split('=', 1)[1]
        if arg == f'--{name}' and i + 1 < len(args):
            return args[i + 1]
    return None


def _run_lines(workdir: str | None, sections: Sequence[str]) -> list[str]:
    """The settings of the run in ``workdir`` (given with --help) in ``sections`` (all when
    empty), else configs/base.py's defaults, with a line saying which."""
    uses = "the run's config.json settings this command uses (the flags above override them)"
    if not sections:
        uses = "the run's config.json settings (the flags above override the eval ones)"
    if workdir:
        try:
            config = rundir.read_config(workdir)
        except rundir.WorkdirError as e:
            note = f'{uses}; {workdir} cannot be read ({e}), so the defaults of configs/base.py:'
        else:
            title = f'{uses}, from {rundir.path(workdir, rundir.CONFIG_FILE)}:'
            return _config_lines(_BASE, title, sections, config)
    else:
        note = f'{uses}; the defaults of configs/base.py (--workdir RUN --help shows its own):'
    return _config_lines(_BASE, note, sections)
