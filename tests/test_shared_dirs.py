"""tests/shared_dirs.py: a directory a module's fixtures build once for all workers."""

import pytest

from tests.shared_dirs import built_once


def test_built_once_then_read_and_a_failed_build_is_redone(tmp_path_factory):
    builds = []

    def build(path, fail=False):
        builds.append(path)
        path.mkdir()
        (path / 'half').touch()
        if fail:
            raise OSError('disk full')
        (path / 'whole').touch()

    with pytest.raises(OSError, match='disk full'):
        built_once(tmp_path_factory, 'shared-test', lambda p: build(p, fail=True))
    first = built_once(tmp_path_factory, 'shared-test', build)
    again = built_once(tmp_path_factory, 'shared-test', build)
    assert first == again and len(builds) == 2  # the failed build, then one that stays
    assert sorted(p.name for p in first.iterdir()) == ['half', 'whole']
