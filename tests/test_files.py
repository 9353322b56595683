"""transformer/files.py: a directory put in place whole, replacing only what its writer made."""

import json
import os

import pytest

from tests.file_tree import tree_hashes
from transformer import files

MARK = files.Mark('written.json', 'a test', {'round': 1})


def _build(content: str, extra=None):
    """A `write_in_place` build writing one file (and calling ``extra`` before it returns)."""

    def build(scratch: str) -> str:
        directory = os.path.join(scratch, 'made')
        os.makedirs(os.path.join(directory, 'sub'))
        with open(os.path.join(directory, 'sub', 'model.bin'), 'w') as f:
            f.write(content)
        if extra:
            extra()
        return directory

    return build


def test_a_directory_goes_in_place_whole_with_its_mark(tmp_path):
    """Into an absent and an empty target; its mark lists every file; nothing left beside."""
    for target in (tmp_path / 'new', tmp_path / 'empty'):
        if target.name == 'empty':
            target.mkdir()
        files.write_in_place(str(target), _build('one'), mark=MARK)
        assert (target / 'sub' / 'model.bin').read_text() == 'one'
        mark = json.loads((target / MARK.name).read_text())
        assert mark == {'written_by': 'a test', 'round': 1, 'files': ['sub/model.bin']}
        assert MARK.foreign(str(target)) == []
    assert sorted(os.listdir(tmp_path)) == ['empty', 'new']


def test_replace_takes_only_a_directory_its_writer_made_and_nothing_else(tmp_path):
    """With ``replace``, a directory holding the writer's mark and nothing it does not list is
    replaced (the old one removed); one with another file, another writer's mark, no mark,
    or a link is refused before anything is written, as is any non-empty one without
    ``replace``."""
    target = tmp_path / 'out'
    files.write_in_place(str(target), _build('one'), mark=MARK)
    files.write_in_place(str(target), _build('two'), mark=MARK, replace=True)
    assert (target / 'sub' / 'model.bin').read_text() == 'two'
    assert sorted(os.listdir(tmp_path)) == ['out']

    def refused(directory, mark=MARK, replace=True):
        before = tree_hashes(tmp_path)
        with pytest.raises(files.NotReplaceable) as info:
            files.write_in_place(str(directory), _build('three'), mark=mark, replace=replace)
        assert tree_hashes(tmp_path) == before
        return str(info.value)

    assert refused(target, replace=False) == f'{target} exists and is not empty'
    other = files.Mark(MARK.name, 'another writer')
    assert refused(target, mark=other) == f'{target} exists and is not empty'
    (target / 'sub' / 'notes.txt').write_text('mine')
    assert refused(target) == f'{target} holds files that a test did not write (sub/notes.txt)'
    os.remove(target / MARK.name)
    assert refused(target) == f'{target} exists and is not empty'
    (tmp_path / 'link').symlink_to(target)
    assert refused(tmp_path / 'link') == f'{tmp_path / "link"} is a link, not a directory'


def test_a_failure_or_a_change_during_the_build_leaves_the_target_as_it_was(tmp_path):
    """A build that raises, and a target that gets a file of someone else's while the build
    runs (checked again before the rename): the target as it was, no scratch left."""
    target = tmp_path / 'out'
    files.write_in_place(str(target), _build('one'), mark=MARK)
    before = tree_hashes(tmp_path)

    def fail():
        raise RuntimeError('the build failed')

    with pytest.raises(RuntimeError, match='the build failed'):
        files.write_in_place(str(target), _build('two', fail), mark=MARK, replace=True)
    assert tree_hashes(tmp_path) == before

    def meddle():
        (target / 'notes.txt').write_text('mine')

    with pytest.raises(files.NotReplaceable, match=r'did not write \(notes.txt\)'):
        files.write_in_place(str(target), _build('two', meddle), mark=MARK, replace=True)
    assert tree_hashes(tmp_path) == {**before, 'out/notes.txt': tree_hashes(target)['notes.txt']}
