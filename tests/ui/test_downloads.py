"""Files the app serves by path: safe names, a folder of their own each, only the newest kept."""

from __future__ import annotations

import os
import shutil

import pytest

from ui import downloads
from ui.downloads import DownloadFolder, write_download


def test_download_files_are_safe(tmp_path):
    a = write_download("é</script>", "../../evil name.json")
    b = write_download(b"\x00\x01", "explanation-x-4steps.json")
    try:
        assert a.name == "evil-name.json" and a.read_text(encoding="utf-8") == "é</script>"
        assert b.read_bytes() == b"\x00\x01" and a.parent != b.parent  # a fresh folder per download
    finally:
        shutil.rmtree(a.parent), shutil.rmtree(b.parent)
    c = write_download("x", "r.html", directory=tmp_path)
    assert c == tmp_path / "r.html" and c.read_text() == "x"


def test_download_folder_keeps_the_newest_files_in_folders_of_their_own():
    folder = DownloadFolder(keep=3)
    root = folder.root
    paths = [folder.write(f"file {i}", "../same name.txt") for i in range(5)]
    assert all(p.parent.parent == root and p.name == "same-name.txt" for p in paths)
    assert [p.exists() for p in paths] == [False, False, True, True, True]  # the two oldest were pruned
    assert paths[-1].read_text() == "file 4" and len(set(p.parent for p in paths)) == 5
    folder.cleanup()  # what happens at exit
    assert not root.exists()
    with pytest.raises(ValueError, match="keep"):
        DownloadFolder(keep=0)


def test_the_apps_downloads_live_in_one_folder_that_keeps_the_newest():
    root = downloads.FOLDER.root
    paths = [downloads.download(f"file {i}", "same-name.txt")["value"] for i in range(downloads.KEEP_DOWNLOADS + 5)]
    assert all(p.startswith(str(root)) for p in paths)
    assert len(list(root.iterdir())) <= downloads.KEEP_DOWNLOADS
    assert open(paths[-1]).read() == f"file {downloads.KEEP_DOWNLOADS + 4}"  # names repeat, files do not clash
    assert not os.path.exists(paths[0])
    assert downloads.no_file() == {"__type__": "update", "value": None, "interactive": False}
