"""Files the app serves by path: safe names, a folder of their own each, only the newest kept."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

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


def test_a_picture_is_served_from_one_file_written_once_so_a_browser_reading_it_never_sees_it_cut(tmp_path):
    """Gradio rewrites a PIL picture's content-named file in place each time it is sent, which cut off a browser
    still reading the first copy (CI: the image tab's overlay never loaded). Ours is written once, atomically."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    first = downloads.served_image(Image.fromarray(pixels), cache=tmp_path)
    path = os.path.realpath(first)
    assert path.startswith(os.path.realpath(tmp_path)) and first.endswith(".png")
    assert np.array_equal(np.asarray(Image.open(first)), pixels)  # lossless: the heat colours as drawn
    data = Path(first).read_bytes()
    with open(first, "r+b") as file:
        file.write(b"MARK")  # a mark in place of the PNG signature: a second write of the picture would undo it
    again = downloads.served_image(Image.fromarray(pixels), cache=tmp_path)  # the same picture, sent again
    assert again == first and Path(first).read_bytes() == b"MARK" + data[4:]  # served from the file as it was
    other = downloads.served_image(Image.fromarray(255 - pixels), cache=tmp_path)
    assert other != first and sorted(p.name for p in tmp_path.rglob("*")).count("image.png") == 2
    assert not [p for p in tmp_path.rglob(".image.*")]  # no staging file left behind


def test_a_picture_aged_out_of_the_cache_is_written_again(tmp_path, monkeypatch):
    """`delete_cache` may remove a picture's file at any time, even as it is being sent again: it is written anew,
    not an error."""
    import numpy as np
    from PIL import Image

    picture = Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8))
    first = downloads.served_image(picture, cache=tmp_path)
    touch = os.utime

    def aged_out(path, *args, **kwargs):  # `delete_cache` removes the file just before it is touched
        Path(path).unlink(missing_ok=True)
        return touch(path, *args, **kwargs)

    monkeypatch.setattr(os, "utime", aged_out)
    again = downloads.served_image(picture, cache=tmp_path)
    assert again == first and np.array_equal(np.asarray(Image.open(again)), np.asarray(picture))
