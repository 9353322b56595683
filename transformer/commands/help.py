"""``-h`` / ``--help`` for every command: its own flags with their defaults and, for a command
that takes ``--config``, every config field with its value and the comment the config files
give it. absl's ``--helpfull`` still lists every flag, the libraries' included."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from absl import flags

from transformer import configs, rundir

HELP_ARGS = ('-h', '--help')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # transformer/
# Files whose comments describe config fields, after the chosen config file itself.
_COMMENTED = (
    configs.path('base'),
    os.path.join(_PACKAGE, 'data', 'config.py'),
)
_ALIAS = re.compile(r'\s*config\.(\w+)\s*=\s*(\w+)\s*=')  # config.model = model = ...
_ASSIGN = re.compile(r'\s*([A-Za-z_][\w.]*)\s*=\s*[^#]*?(?:#\s*(.*))?$')


def wanted(argv: Sequence[str]) -> bool:
    return any(arg in HELP_ARGS for arg in argv[1:])


def _comments(path: str) -> dict[str, str]:
    """Config key -> comment (the line's own, else the comment lines right above it)."""
    data_section = path.endswith(os.path.join('data', 'config.py'))
    aliases = {'config': 'data' if data_section else ''}
    found, above = {}, []
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if stripped.startswith('#'):
                above.append(stripped.lstrip('# '))
                continue
            if alias := _ALIAS.match(line):
                aliases[alias.group(2)] = alias.group(1)
            match = _ASSIGN.match(line)
            if match and '.' in match.group(1):
                owner, _, field = match.group(1).partition('.')
                if owner in aliases:
                    key = '.'.join(p for p in (aliases[owner], field) if p)
                    comment = match.group(2) or ' '.join(above)
                    if comment and key not in found:
                        found[key] = comment.strip()
            above = []
    return found


def _config_lines(
    config_path: str, title: str, sections: Sequence[str] = (), config=None
) -> list[str]:
    """``title`` and a line per field of the config file (or of ``config``, a run's)."""
    comments = {}
    for path in (*_COMMENTED, config_path):
        comments |= _comments(path)
    lines = [title]
    config = configs.load(config_path) if config is None else config
    for key, value in rundir.flat_config(config).items():
        if sections and key.split('.')[0] not in sections:
            continue
        comment = f'  # {comments[key]}' if key in comments else ''
        lines.append(f'  {key} = {value!r}{comment}')
    return lines


def text(doc: str, flag_names: Sequence[str], argv: Sequence[str]) -> str:
    """The help of a command: ``doc``'s first paragraph, its flags, its config's fields."""
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
        path = chosen.split(':')[0] if chosen else _COMMENTED[0]
        title = f'config fields (override with --config.FIELD=VALUE), from {path}:'
        lines += ['', *_config_lines(path, title)]
    elif 'workdir' in flag_names:
        lines += ['', *_run_lines(_flag_value(argv, 'workdir'))]
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


def _run_lines(workdir: str | None) -> list[str]:
    """The eval settings of the run in ``workdir`` (given with --help), else configs/base.py's
    defaults, with a line saying which."""
    uses = "the run's config.json settings this command uses (the flags above override them)"
    if workdir:
        try:
            config = rundir.read_config(workdir)
        except rundir.WorkdirError as e:
            note = f'{uses}; {workdir} cannot be read ({e}), so the defaults of configs/base.py:'
        else:
            title = f'{uses}, from {rundir.path(workdir, rundir.CONFIG_FILE)}:'
            return _config_lines(_COMMENTED[0], title, ('eval',), config)
    else:
        note = f'{uses}; the defaults of configs/base.py (--workdir RUN --help shows its own):'
    return _config_lines(_COMMENTED[0], note, sections=('eval',))
