"""`runtime.files.write_atomically`: the whole file or none, never a staging file left behind."""

import os

import pytest

from explainer.runtime.files import write_atomically


def test_a_file_is_written_whole_into_a_new_folder_and_replaced_whole(tmp_path):
    path = tmp_path / "a" / "b" / "data.json"
    assert write_atomically(path, b"first") == path and path.read_bytes() == b"first"
    write_atomically(str(path), b"second, longer")
    assert path.read_bytes() == b"second, longer"
    assert sorted(p.name for p in path.parent.iterdir()) == ["data.json"]  # no staging file left


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_staging_file(tmp_path, monkeypatch):
    path = tmp_path / "image.png"
    path.write_bytes(b"old")

    def failing_replace(src, dst):
        assert open(src, "rb").read() == b"new"  # the staging file holds the whole new content before the rename
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_atomically(path, b"new")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["image.png"]
