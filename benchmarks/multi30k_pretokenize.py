"""How closely ``data.pretokenize='moses'`` reproduces the published Multi30k preprocessing.

Wu et al. (ACL 2021; github.com/LividWo/Revisit-MMT, fairseq) ship their BPE'd Multi30k
files (data/multi30k-en-de/{train,valid,test.2016}.{en,de}): the dataset's ``*.lc.norm.tok``
text (lowercase, Moses punctuation normalisation, Moses tokenization with XML escaping) cut
by their BPE. This script removes the BPE ("@@ "), runs our pretokenizer on the raw files of
the same split (lowercasing first, as a case-folding vocabulary does) and counts the lines
that match exactly and those with the same tokens, per language; it also counts the other
order (tokenize, then lowercase: what the vocabulary's fold alone would give) and prints
every mismatching line. Prints the figures and saves them as JSON.

    .venv/bin/python benchmarks/multi30k_pretokenize.py --reference PATH_TO_Revisit-MMT

``--reference`` is a checkout of that repository or a bare git directory of it.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from transformer import data, schema  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / 'shared' / 'data' / 'multi30k'
# Our split -> the name of its files in data/multi30k-en-de/ of their repository.
THEIR_NAMES = {'test2016': 'test.2016', 'validation': 'valid', 'train': 'train'}
LANGUAGES = {'source': 'en', 'target': 'de'}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reference', required=True, help='Revisit-MMT checkout or bare git dir')
    parser.add_argument('--manual_dir', default=str(DEFAULT_MULTI30K), help='raw Multi30k files')
    parser.add_argument('--splits', default='test2016,validation,train', help='comma-separated')
    parser.add_argument(
        '--out', default=str(REPO / 'benchmarks' / 'results' / 'multi30k_pretokenize.json')
    )
    return parser.parse_args(argv)


def their_lines(reference: str, split: str, lang: str) -> list[str]:
    """Their preprocessed lines of a split, with the BPE joints removed."""
    path = f'data/multi30k-en-de/{THEIR_NAMES[split]}.{lang}'
    file = pathlib.Path(reference) / path
    if file.is_file():
        text = file.read_text(encoding='utf-8')
    else:  # a bare repository
        command = ['git', f'--git-dir={reference}', 'show', f'HEAD:{path}']
        text = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return [line.replace('@@ ', '') for line in text.split('\n')[:-1]]


def their_commit(reference: str) -> str:
    """The commit of the reference (a checkout or a bare git directory)."""
    where = (
        ['-C', reference]
        if (pathlib.Path(reference) / '.git').exists()
        else [f'--git-dir={reference}']
    )
    command = ['git', *where, 'rev-parse', 'HEAD']
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def compare(ours: list[str], theirs: list[str]) -> dict:
    if len(ours) != len(theirs):
        raise SystemExit(f'{len(ours)} raw lines but {len(theirs)} reference lines.')
    mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    return {
        'lines': len(ours),
        'matching': len(ours) - len(mismatches),
        'rate': (len(ours) - len(mismatches)) / len(ours),
        # Whitespace aside: what the SentencePiece model reads.
        'same_tokens': sum(a.split() == b.split() for a, b in zip(ours, theirs, strict=True)),
        'mismatches': [{'line': i + 1, 'ours': a, 'theirs': b} for i, a, b in mismatches],
    }


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    config = schema.default_config().data
    config.update(dict(dataset='multi30k', manual_dir=args.manual_dir))
    report = {'reference': f'LividWo/Revisit-MMT@{their_commit(args.reference)}', 'splits': {}}
    for split in args.splits.split(','):
        texts = dict(zip(('source', 'target'), data.load_text(config, split), strict=True))
        report['splits'][split] = {}
        for side, lang in LANGUAGES.items():
            theirs = their_lines(args.reference, split, lang)
            first = data.Pretokenizer('moses', 'en', 'de', lowercase=True)
            last = data.Pretokenizer('moses', 'en', 'de', lowercase=False)
            ours = [first.encode(line, side) for line in texts[side]]
            folded_after = [last.encode(line, side).lower() for line in texts[side]]
            result = compare(ours, theirs)
            result['lowercase_last_matching'] = compare(folded_after, theirs)['matching']
            report['splits'][split][lang] = result
            print(
                f'{split} {lang}: {result["matching"]}/{result["lines"]} lines match '
                f'({100 * result["rate"]:.3f}%), {result["same_tokens"]} with the same tokens; '
                'lowercasing after tokenizing: '
                f'{result["lowercase_last_matching"]}/{result["lines"]}'
            )
            for m in result['mismatches']:
                print(f'  line {m["line"]}\n    ours:   {m["ours"]}\n    theirs: {m["theirs"]}')
    common.write_report(args.out, report)


if __name__ == '__main__':
    main()
