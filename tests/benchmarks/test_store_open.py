"""benchmarks/store_open.py on a tiny store: the bytes its open reads, as the script reports
them; its figures are not results."""

import json
import os

import numpy as np
import pytest

from benchmarks import store_open
from transformer.data import token_store, tokenized


@pytest.mark.slow
def test_the_first_open_after_a_time_change_reads_the_store_and_the_next_only_its_manifest(
    tmp_path,
):
    path = str(tmp_path / 'train.store')
    ids = np.arange(60_000, dtype=np.int32) % 300
    offsets = np.arange(0, 60_001, 6)
    token_store.from_split(path, tokenized.TokenizedSplit(ids, offsets, ids, offsets))
    # A time the manifest does not hold: one second later than the file's (a plain touch can
    # leave the same time on a file system with coarse timestamps).
    ids_file = os.path.join(path, 'source_ids.bin')
    held = os.stat(ids_file)
    os.utime(ids_file, ns=(held.st_atime_ns, held.st_mtime_ns + 1_000_000_000))
    out = tmp_path / 'report.json'
    store_open.main(['--stores', path, '--opens=2', f'--out={out}'])
    report = json.loads(out.read_text())['stores'][path]
    first, second = report['opens']
    assert report['pairs'] == 10_000 and first['store_bytes'] > 240_000
    manifest = os.path.getsize(os.path.join(path, 'manifest.json'))
    assert first['rchar'] >= first['store_bytes'] - manifest
    assert second['rchar'] < 8192 and second['resident_after'] <= second['store_bytes']
