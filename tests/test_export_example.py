"""docs/export.md's CTranslate2 example, run as the page writes it (only its ``lines``
replaced), on the CTranslate2 export of a converted MarianMT, which has a source.spm and a
target.spm of its own: it prints the text ``translate`` gives."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.marian_dir import TRAINED_LINES, marian_dir, synthetic_lines
from tests.subprocess_env import repo_env
from transformer import api, convert, export

_SKIP = "{} is not installed: pip install -e '.[export]'"
pytest.importorskip('ctranslate2', reason=_SKIP.format('ctranslate2'))
pytest.importorskip('transformers', reason=_SKIP.format('transformers'))

DOC = Path(__file__).parents[1] / 'docs' / 'export.md'
EXPORT = 'exports/m30k-ct2'  # where the example reads the export, from its directory
LINES = [s for s, _ in synthetic_lines()][:TRAINED_LINES]


def ctranslate2_example() -> str:
    """The one Python block of docs/export.md that builds a ctranslate2.Translator and reads
    source.spm (the page's other one translates with NLLB-200's language codes)."""
    blocks = re.findall(r'```python\n(.*?)```', DOC.read_text(encoding='utf-8'), re.S)
    found = [b for b in blocks if 'ctranslate2.Translator(' in b and 'source.spm' in b]
    assert len(found) == 1, f'{DOC} has {len(found)} CTranslate2 examples'
    return found[0]


def _with_lines(code: str, lines: list[str]) -> str:
    """``code`` with its one ``lines = [...]`` line replaced by ``lines``."""
    at = [line for line in code.splitlines() if line.startswith('lines = ')]
    assert len(at) == 1, 'the example names its input in one `lines = [...]` line'
    return code.replace(at[0], f'lines = {lines!r}')


@pytest.mark.slow
def test_ctranslate2_example_prints_translates_text(tmp_path_factory, tmp_path):
    run_dir = tmp_path / 'run'
    convert.convert(marian_dir(tmp_path_factory), str(run_dir))
    out = tmp_path / EXPORT
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={run_dir}', f'--out={out}', '--format=ctranslate2'])
    assert info.value.code is None, info.value.code
    # Two SentencePiece models: decoding the output with source.spm would garble it.
    assert (out / 'source.spm').read_bytes() != (out / 'target.spm').read_bytes()
    done = subprocess.run(
        [sys.executable, '-c', _with_lines(ctranslate2_example(), LINES)],
        cwd=tmp_path,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == api.load(str(run_dir)).translate(LINES, beam_size=1)
