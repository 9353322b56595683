"""The training split's token store: the same ids, batches and resumed batches as the split
tokenized in memory, narrow bookkeeping, streaming preparation whose memory does not grow with
the corpus, the vocabulary's sample unchanged, damaged stores refused in one line, and an
open that reads the manifest, not the files, unless their times disagree with it."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.subprocess_env import REPO, repo_env
from tests.tiny_run import data_config
from transformer import data
from transformer.data import packing, sources, store_manifest, token_store, tokenized, tokenizer

MAX_LEN = 32
FIELDS = ('source_ids', 'source_offsets', 'target_ids', 'target_offsets')


def _config(**overrides):
    return data_config(**{'max_len': MAX_LEN, **overrides})


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
    return data.get_tokenizer(_config(), str(tmp_path_factory.mktemp('vocab') / 'spm.model'))


@pytest.fixture(scope='module')
def in_memory(vocab):
    return data.tokenize_split(_config(), vocab, 'train')


@pytest.fixture(scope='module')
def store_path(vocab, tmp_path_factory):
    """The store of the same split, built from chunks of 7 pairs (many chunks, a short last)."""
    path = str(tmp_path_factory.mktemp('store') / 'train.store')
    token_store.build(path, sources.read_chunks(_config(), 'train', 7), vocab)
    return path


def test_the_store_holds_the_ids_of_the_split_in_narrow_types(store_path, in_memory):
    store = data.open_store(store_path)
    assert store.num_examples == in_memory.num_examples == 600
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(store, field), getattr(in_memory, field))
    for side in ('source', 'target'):
        np.testing.assert_array_equal(
            getattr(store, f'{side}_lengths'), getattr(in_memory, f'{side}_lengths')
        )
        assert getattr(store, f'{side}_lengths').dtype == np.uint16
        assert getattr(store, f'{side}_offsets').dtype == np.uint32
        assert getattr(store, f'{side}_ids').dtype == np.uint16
        assert isinstance(getattr(store, f'{side}_ids').base, np.memmap)  # read from the file


def _batches(iterator, n):
    return [next(iterator) for _ in range(n)]


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize('long_examples', ['drop', 'truncate'])
def test_store_batches_equal_in_memory_batches_over_epochs(store_path, in_memory, long_examples):
    kwargs = {'batch_size': 4, 'seed': 3, 'max_len': 12, 'long_examples': long_examples}
    kwargs['chunk_size'] = 64  # several packing chunks an epoch
    ours = data.TrainIterator(data.open_store(store_path), **kwargs)
    theirs = data.TrainIterator(in_memory, **kwargs)
    batches = []
    while ours.epoch < 1 or len(batches) < 20:  # into a second epoch
        batches.append(next(ours))
    _assert_batches_equal(batches, _batches(theirs, len(batches)))
    assert ours.stats() == theirs.stats()


def test_bookkeeping_is_a_few_bytes_a_pair(store_path):
    """What a process holds per pair besides the store's pages: the clipped lengths (2 + 2
    bytes), the kept examples and one epoch's permutation (4 + 4): 12 bytes."""
    iterator = data.TrainIterator(data.open_store(store_path), batch_size=4, seed=0, max_len=64)
    next(iterator)
    held = [iterator._source_lengths, iterator._target_lengths, iterator._examples]
    held.append(iterator._permutation[2])
    assert not any(isinstance(a.base, np.memmap) for a in held)
    assert sum(a.nbytes for a in held) <= 12 * 600


def test_resume_from_the_store_is_exact_across_data_groups(store_path):
    """A state saved after 5 batches of 8 rows on one data group (one device) continues with
    the same rows on 8, 2 or 1 groups: 8 -> 2 -> 1 devices, or processes."""
    store = data.open_store(store_path)
    kwargs = {'batch_size': 8, 'seed': 1, 'max_len': MAX_LEN, 'chunk_size': 100}
    whole = data.TrainIterator(store, **kwargs)
    _batches(whole, 5)
    state = whole.get_state()
    expected = _batches(whole, 6)
    for groups in (8, 2, 1):
        parts = []
        for group in range(groups):
            it = data.TrainIterator(store, data_group=group, data_groups=groups, **kwargs)
            it.set_state(json.loads(json.dumps(state)))
            parts.append(_batches(it, 6))
        joined = [
            {k: np.concatenate([p[i][k] for p in parts]) for k in expected[0]} for i in range(6)
        ]
        _assert_batches_equal(joined, expected)


def test_make_train_iterator_builds_the_store_once_and_equals_memory(vocab, tmp_path, caplog):
    config = _config()
    kwargs = {'batch_size': 4, 'seed': 2}
    caplog.set_level(logging.INFO)
    stored = data.make_train_iterator(config, vocab, cache_dir=str(tmp_path), **kwargs)
    again = data.make_train_iterator(config, vocab, cache_dir=str(tmp_path), **kwargs)
    memory = data.make_train_iterator(config, vocab, cache_dir=None, **kwargs)
    assert sum('into the token store' in r.getMessage() for r in caplog.records) == 1
    (store,) = [p for p in os.listdir(tmp_path) if p.endswith('.store')]
    assert not [p for p in os.listdir(tmp_path) if p.endswith('.npz')]
    batches = _batches(stored, 10)
    _assert_batches_equal(batches, _batches(memory, 10))
    _assert_batches_equal(batches, _batches(again, 10))
    with pytest.raises(data.DataError, match='must see the same data.cache_dir'):
        data.make_train_iterator(
            config, vocab, cache_dir=str(tmp_path / 'x'), build=False, **kwargs
        )


def test_a_run_with_an_npz_cache_resumes_with_the_same_batches(vocab, tmp_path, caplog):
    """A run started before the store cached its ids in an .npz file: the store is made from
    that file (one line says so), so its examples, and so its permutation and batches, are the
    ones the run trained on, even where the text has changed since."""
    config = _config()
    old = tokenized.tokenize_split(config, vocab, 'train', str(tmp_path))  # the earlier cache
    path = tokenized.cache_path(str(tmp_path), config, vocab, 'train')
    edited = tokenized.TokenizedSplit(
        old.source_ids[::-1].copy(), old.source_offsets, old.target_ids, old.target_offsets
    )
    tokenized._save(path, edited)  # not what tokenizing the text would give
    caplog.set_level(logging.INFO)
    iterator = data.make_train_iterator(
        config, vocab, cache_dir=str(tmp_path), batch_size=4, seed=0
    )
    assert sum('Converted the token cache' in r.getMessage() for r in caplog.records) == 1
    expected = data.TrainIterator(edited, batch_size=4, seed=0, max_len=MAX_LEN)
    _assert_batches_equal(_batches(iterator, 12), _batches(expected, 12))


@pytest.mark.parametrize(
    ('damage', 'message'),
    [
        ('truncate', 'source_ids.bin is 10 bytes, its manifest says'),
        ('flip', 'target_offsets.bin fails its checksum'),
        ('remove', 'source_lengths.bin is missing'),
        ('manifest', 'has no readable manifest.json'),
    ],
)
def test_a_damaged_store_is_refused_in_one_line(store_path, tmp_path, damage, message):
    import shutil

    path = str(tmp_path / 'damaged.store')
    shutil.copytree(store_path, path)
    if damage == 'truncate':
        with open(os.path.join(path, 'source_ids.bin'), 'r+b') as f:
            f.truncate(10)
    elif damage == 'flip':
        with open(os.path.join(path, 'target_offsets.bin'), 'r+b') as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 1]))
    elif damage == 'remove':
        os.remove(os.path.join(path, 'source_lengths.bin'))
    else:
        with open(os.path.join(path, 'manifest.json'), 'w') as f:
            f.write('{"files": ')
    with pytest.raises(data.DataError) as info:
        data.open_store(path)
    assert message in str(info.value) and '\n' not in str(info.value)
    assert f'remove {path}' in str(info.value)


def _flip(file, at=5, keep_time=True):
    """One byte of ``file`` changed, its size and (``keep_time``) modification time kept."""
    before = os.stat(file)
    with open(file, 'r+b') as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    if keep_time:
        os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))


def _copy(store_path, tmp_path, name='copy.store'):
    import shutil

    path = str(tmp_path / name)
    shutil.copytree(store_path, path)  # (file times kept, as `cp -a` or `rsync -a` keep them)
    return path


def test_a_flipped_byte_with_its_time_kept_is_found_by_the_full_check_only(store_path, tmp_path):
    """The documented trade: an open checks sizes and times; a byte changed in place, with
    the file's time put back, is found by the full check (`verify_token_store`: the build's
    and ``transformer-prepare --verify``'s) and not by an open. Then a changed time alone
    makes the open check in full, which refuses it."""
    path = _copy(store_path, tmp_path)
    ids = os.path.join(path, 'source_ids.bin')
    _flip(ids)
    assert data.open_store(path).num_examples == 600  # not read: the trade
    with pytest.raises(data.DataError) as info:
        data.verify_token_store(path)
    assert f'{ids} fails its checksum' in str(info.value) and '\n' not in str(info.value)
    mtime = os.stat(ids).st_mtime_ns
    os.utime(ids, ns=(mtime, mtime + 10**9))
    with pytest.raises(data.DataError, match='source_ids.bin fails its checksum'):
        data.open_store(path)


def test_offsets_that_do_not_span_the_ids_are_refused_by_an_open(store_path, tmp_path):
    """The last offset changed in place, its file's time kept: the open reads it and stops."""
    path = _copy(store_path, tmp_path)
    offsets = os.path.join(path, 'target_offsets.bin')
    _flip(offsets, at=os.path.getsize(offsets) - 3)
    with pytest.raises(data.DataError) as info:
        data.open_store(path)
    assert f'{offsets} does not span target_ids.bin; remove {path}' in str(info.value)


def test_the_build_checks_what_it_wrote_before_the_rename(vocab, tmp_path, monkeypatch):
    """A byte changed between writing and the rename (its time kept) stops the build in one
    line; neither the store nor its staging directory is left."""
    written = store_manifest.write

    def write_then_damage(directory, *args, **kwargs):
        written(directory, *args, **kwargs)
        _flip(os.path.join(directory, 'target_ids.bin'))

    monkeypatch.setattr(store_manifest, 'write', write_then_damage)
    path = str(tmp_path / 'cache' / 'train.store')
    with pytest.raises(data.DataError) as info:
        token_store.build(path, sources.read_chunks(_config(), 'train', 100), vocab)
    message = str(info.value)
    assert 'failed its check after writing: target_ids.bin fails its checksum' in message
    assert '\n' not in message and os.listdir(tmp_path / 'cache') == []


def _thread_reads():
    """Bytes this thread has read through read(2) and its kin (``rchar``), the mapped pages
    aside."""
    with open('/proc/thread-self/io') as f:
        return int(next(line for line in f if line.startswith('rchar:')).split()[1])


def _reads_of_open(path):
    before = _thread_reads()
    data.open_store(path)
    return _thread_reads() - before


@pytest.mark.skipif(not os.path.exists('/proc/thread-self/io'), reason='needs Linux /proc')
def test_an_open_reads_the_manifest_whatever_the_store_size(store_path, in_memory, tmp_path):
    """A store 20 times larger: the same bytes read by its open, besides the manifest (whose
    numbers have more digits), and under 8 KiB in all; its files are not read."""
    large = str(tmp_path / 'large.store')
    parts = [in_memory] * 20
    fields = {}
    for side in ('source', 'target'):
        ids = [getattr(p, f'{side}_ids') for p in parts]
        lengths = np.concatenate([getattr(p, f'{side}_lengths') for p in parts])
        fields[f'{side}_ids'] = np.concatenate(ids)
        fields[f'{side}_offsets'] = np.concatenate([[0], np.cumsum(lengths)])
    token_store.from_split(large, tokenized.TokenizedSplit(**fields))
    sizes = {p: sum(e.stat().st_size for e in os.scandir(p)) for p in (store_path, large)}
    assert sizes[large] > 19 * sizes[store_path]
    manifest = {p: os.path.getsize(os.path.join(p, 'manifest.json')) for p in sizes}
    reads = {p: _reads_of_open(p) for p in sizes}
    assert reads[large] - manifest[large] == reads[store_path] - manifest[store_path], reads
    assert reads[large] < 8192 < sizes[store_path]


def test_a_store_whose_times_disagree_is_checked_once_then_opens_quickly(store_path, tmp_path):
    """Files copied without their times (``cp -r``), or a manifest written before times were
    recorded: the first open reads every file, records the times, and the next reads none."""
    path = _copy(store_path, tmp_path)
    manifest = os.path.join(path, 'manifest.json')
    with open(manifest) as f:
        content = json.load(f)
    for entry in content['files'].values():
        del entry['mtime_ns']  # as written before the times were recorded
    with open(manifest, 'w') as f:
        json.dump(content, f)
    size = sum(e.stat().st_size for e in os.scandir(path))
    assert _reads_of_open(path) > size - os.path.getsize(manifest)
    assert _reads_of_open(path) < 8192
    for name in content['files']:
        os.utime(os.path.join(path, name))  # (now)
    assert _reads_of_open(path) > 8192
    assert _reads_of_open(path) < 8192


def test_a_store_whose_manifest_cannot_be_rewritten_opens_after_the_full_check(
    store_path, tmp_path, monkeypatch
):
    """A read-only store (a shared file system mounted so) whose times disagree: each open
    checks it in full and opens it."""
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, 'Read-only file system')

    path = _copy(store_path, tmp_path)
    os.utime(os.path.join(path, 'source_lengths.bin'))
    monkeypatch.setattr(store_manifest, 'write', read_only)
    assert data.open_store(path).num_examples == 600
    assert _reads_of_open(path) > 8192  # (again: the times could not be recorded)


def _write_folder(folder, pairs):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / 'train.en', 'w') as s, open(folder / 'train.de', 'w') as t:
        for i in range(pairs):
            s.write(f'line {i % 97} of the source , word {i % 13} .\n')
            t.write(f'Zeile {i % 89} des Ziels , Wort {i % 11} .\n')


def test_the_vocabulary_sample_is_the_one_of_the_whole_split(tmp_path, monkeypatch):
    """Streamed in chunks of 10 pairs, the sample is `sample_indices`' of the split read whole:
    the same sentences in the same order, so vocabularies do not change."""
    _write_folder(tmp_path / 'corpus', 95)
    config = _config(dataset='folder', vocab_sample_size=60)
    config.folder = str(tmp_path / 'corpus')
    monkeypatch.setattr(sources, 'CHUNK_PAIRS', 10)
    texts, targets = sources.load_text(config, 'train')
    picked = tokenizer.sample_indices(len(texts), len(targets), 60)
    expected = [texts[i] if i < len(texts) else targets[i - len(texts)] for i in picked]
    assert tokenizer._sample(config, 'nmt_nfkc') == expected
    assert any(i >= len(texts) for i in picked) and any(i < len(texts) for i in picked)


_PREPARE = """
import json, resource, sys
from transformer import data
from transformer.data import sources, token_store
from tests.tiny_run import data_config
config = data_config(dataset='folder', max_len=64)
config.folder = sys.argv[1]
sources.CHUNK_PAIRS = 5000
vocab = data.Tokenizer(sys.argv[2], data_config=config)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
path = token_store.prepare(config, vocab, sys.argv[3], 'train')
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({'grew_kib': after - before, 'pairs': data.open_store(path).num_examples}))
"""


@pytest.mark.slow
def test_preparation_memory_does_not_grow_with_the_corpus(tmp_path):
    """Peak RSS growth of preparing 20k and 320k pairs (chunks of 5000): within 16 MiB of each
    other. Holding the split, as tokenizing it in memory does, grows ~60 bytes a pair of these
    short lines (300k pairs: ~17 MiB of text and ids, before any Python list overhead, which
    is several times that)."""
    _write_folder(tmp_path / 'small', 20_000)
    _write_folder(tmp_path / 'large', 320_000)
    config = _config(dataset='folder', vocab_size=200)
    config.folder = str(tmp_path / 'small')
    vocab = data.get_tokenizer(config, str(tmp_path / 'spm.model'))
    grew = {}
    for name in ('small', 'large'):
        done = subprocess.run(
            [sys.executable, '-c', textwrap.dedent(_PREPARE), str(tmp_path / name)]
            + [vocab.model_path, str(tmp_path / f'cache-{name}')],
            cwd=REPO,
            env=repo_env(JAX_PLATFORMS='cpu'),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        grew[name] = result['grew_kib']
        assert result['pairs'] == (20_000 if name == 'small' else 320_000)
    assert grew['large'] - grew['small'] < 16 * 1024, grew


def test_folder_chunks_equal_the_whole_read(tmp_path):
    folder = tmp_path / 'hostile'
    folder.mkdir()
    (folder / 'train.en').write_bytes(b'a\r\nb\xff\n\x00c\n\nlast')
    (folder / 'train.de').write_bytes(b'A\nB\nC\n\nLAST\n')
    config = _config(dataset='folder')
    config.folder = str(folder)
    whole = sources.load_text(config, 'train')
    chunks = list(sources.read_chunks(config, 'train', 2))
    assert [len(s) for s, _ in chunks] == [2, 2, 1]
    assert (sum((s for s, _ in chunks), []), sum((t for _, t in chunks), [])) == whole
    (folder / 'train.de').write_bytes(b'A\nB\n')
    with pytest.raises(data.DataError, match='has 5 lines but .* has 2'):
        list(sources.read_chunks(config, 'train', 2))


def test_kept_examples_match_the_whole_split_scan(in_memory, monkeypatch):
    """The kept examples, scanned in blocks of 50, are those of the whole split at once."""
    monkeypatch.setattr(packing, '_BOOKKEEPING_BLOCK', 50)
    kept, empty, long = packing._kept_examples(in_memory, 10, 'drop')
    lengths = np.maximum(in_memory.source_lengths, in_memory.target_lengths)
    np.testing.assert_array_equal(kept, np.flatnonzero(lengths <= 10))
    assert long == int((lengths > 10).sum()) > 0 and empty == 0
