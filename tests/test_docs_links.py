"""Every relative link in README.md, docs/ and benchmarks/README.md resolves: the file exists,
and a ``#anchor`` names a heading of the file it points into (GitHub's rule for heading ids)."""

import pathlib
import re
import unicodedata

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md')), REPO / 'benchmarks/README.md']
_FENCE = re.compile(r'^(```|~~~).*?^\1', re.M | re.S)
_CODE = re.compile(r'`[^`\n]*`')
_LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
_HEADING = re.compile(r'^#{1,6}\s+(.+?)\s*#*\s*$', re.M)


def _prose(text: str) -> str:
    """``text`` without code blocks and code spans, whose brackets are no links."""
    return _CODE.sub('', _FENCE.sub('', text))


def anchor(heading: str) -> str:
    """GitHub's id of a heading: its text (markup and link targets dropped), lowercased,
    punctuation other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link: its text
    text = re.sub(r'<[^>]+>', '', text).replace('`', '')
    text = re.sub(r'(\*\*|__|\*)', '', text)
    kept = (c for c in text.lower() if c in '-_ ' or unicodedata.category(c)[0] in 'LNM')
    return ''.join(kept).replace(' ', '-')


def anchors(path: pathlib.Path) -> set[str]:
    """The ids of every heading of ``path``; a repeated id gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in _HEADING.findall(_FENCE.sub('', path.read_text(encoding='utf-8'))):
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f'{base}-{count}')
    return ids


def links(path: pathlib.Path) -> list[str]:
    """The relative link targets of ``path`` (web addresses left out)."""
    found = _LINK.findall(_prose(path.read_text(encoding='utf-8')))
    return [t for t in found if not re.match(r'[a-z][a-z0-9+.-]*:', t, re.I)]


def test_anchor_follows_githubs_rule():
    assert anchor('`gpu_check.py` and `step_variants.py`') == 'gpu_checkpy-and-step_variantspy'
    assert anchor('`peers.py` (`../shared/bench/peers.py`)') == 'peerspy-sharedbenchpeerspy'
    assert anchor('Every command: console, compilation cache, host memory') == (
        'every-command-console-compilation-cache-host-memory'
    )
    assert anchor('On a [GPU](gpu.md) **now**') == 'on-a-gpu-now'


@pytest.mark.parametrize('doc', DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(doc):
    broken = []
    for target in links(doc):
        file, _, fragment = target.partition('#')
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f'{target}: no file {path}')
        elif fragment and path.suffix == '.md' and fragment not in anchors(path):
            broken.append(f'{target}: no heading #{fragment} in {path.relative_to(REPO)}')
    assert not broken, f'{doc.relative_to(REPO)}:\n' + '\n'.join(broken)
