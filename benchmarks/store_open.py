"""A token store's open (`open_store`): its seconds, the bytes it reads and the pages of the
store's files in the page cache after it, each open in a fresh process of a checkout's code,
the store's files dropped from the page cache first.

The stores are those `corpus_scale.py` prepares (``--scratch``; each of its workdirs'
``data_cache/*.store``) or ``--stores``. Before each open the files are written back and
dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``: clean pages, no root
needed); the open's own thread's ``rchar`` (bytes returned by read calls) and ``read_bytes``
(bytes fetched from storage) come from ``/proc/thread-self/io``; the pages resident after it
from ``mincore`` over each file (a map of the file's pages that reads none). ``--opens N``
opens each store N times: with a store whose manifest holds no modification times (written by
an earlier version) or whose files' times changed, the first open of this checkout checks in
full and records them, and the later ones are quick.

    python benchmarks/store_open.py --opens 2                     # corpus_scale.py's stores
    python benchmarks/store_open.py --repo /tmp/before --opens 1  # an earlier checkout
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]

# Run in a fresh process of the measured checkout's code: argv[1] its root, argv[2] the store.
_OPEN = r"""
import ctypes, json, mmap, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from transformer.data.token_store import open_store

path = sys.argv[2]
files = sorted(e.path for e in os.scandir(path) if e.is_file())
libc = ctypes.CDLL(None, use_errno=True)


def resident(file):
    size = os.path.getsize(file)
    if not size:
        return 0
    with open(file, 'rb') as f:
        mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    view = np.frombuffer(mapped, np.uint8)
    if libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec):
        raise OSError(ctypes.get_errno(), 'mincore')
    del view
    mapped.close()
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


def io():
    with open('/proc/thread-self/io') as f:
        return {k: int(v) for k, v in (line.split(':') for line in f)}


for file in files:  # written back, then dropped from the page cache
    fd = os.open(file, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
before_pages = sum(resident(f) for f in files)
before = io()
start = time.perf_counter()
open_store(path)
seconds = time.perf_counter() - start
after = io()
start = time.perf_counter()
open_store(path)
print('OPEN', json.dumps({
    'seconds': seconds,
    'again_seconds': time.perf_counter() - start,
    'rchar': after['rchar'] - before['rchar'],
    'read_bytes': after['read_bytes'] - before['read_bytes'],
    'resident_before': before_pages,
    'resident_after': sum(resident(f) for f in files),
    'store_bytes': sum(os.path.getsize(f) for f in files),
}))
"""


def open_once(repo: str, store: str) -> dict:
    """One open of ``store`` in a fresh process of ``repo``'s code, its files not cached."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    done = subprocess.run(
        [sys.executable, '-c', _OPEN, repo, store],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f'opening {store} failed: {done.stderr.strip()[-2000:]}')
    line = [x for x in done.stdout.splitlines() if x.startswith('OPEN ')][-1]
    return json.loads(line[len('OPEN ') :])


def _num_examples(store: str) -> int:
    with open(os.path.join(store, 'manifest.json'), encoding='utf-8') as f:
        return int(json.load(f)['num_examples'])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--stores', nargs='*', help="default: corpus_scale.py's in --scratch")
    parser.add_argument('--scratch', default='/tmp/corpus_scale')
    parser.add_argument('--repo', default=str(REPO), help='the checkout whose code opens')
    parser.add_argument('--opens', type=int, default=2, help='opens of each store, in turn')
    parser.add_argument('--out', default=str(REPO / 'benchmarks/results/store_open.json'))
    args = parser.parse_args(argv)
    stores = args.stores or sorted(glob.glob(f'{args.scratch}/*/data_cache/*.store'))
    if not stores:
        raise SystemExit(f'no token store found in {args.scratch}; give --stores')
    tag = subprocess.run(
        ['git', '-C', args.repo, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True
    ).stdout.strip()
    report = {'repo': args.repo, 'commit': tag, 'stores': {}}
    for store in sorted(stores, key=_num_examples):
        opens = [open_once(args.repo, store) for _ in range(args.opens)]
        report['stores'][store] = {'pairs': _num_examples(store), 'opens': opens}
        print(json.dumps({store: report['stores'][store]}), flush=True)
    report['machine'] = common.host()
    common.write_report(args.out, report)


if __name__ == '__main__':
    main()
