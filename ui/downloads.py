"""Files the app serves by path (`gr.DownloadButton`): one temporary folder per process keeping the newest files;
and the pictures it shows, written once each into Gradio's cache (`served_image`).

Gradio copies a returned file into its own cache before the reply is sent (that cache is cleaned by the Blocks'
`delete_cache`), so only the newest few of ours are ever needed again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder
from PIL import Image

from explainer.result.attribution import Attribution
from explainer.runtime.files import write_atomically
from visuals.export import png_bytes

KEEP_DOWNLOADS = 32  # files kept in the process's download folder
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def write_download(data: str | bytes, filename: str, directory: str | os.PathLike | None = None) -> Path:
    """Write one download to a file of its own.

    Args:
        data: the content; text is written as UTF-8.
        filename: the name the user sees (made safe: letters, digits and `._-`).
        directory: where to write; None makes a fresh temporary folder per call, so concurrent users never share
            a file.

    Returns:
        The path of the written file.
    """
    folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="explainer-export-"))
    name = _UNSAFE_NAME.sub("-", os.path.basename(filename)).strip("-") or "download"
    path = folder / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else bytes(data))
    return path


class DownloadFolder:
    """A temporary folder for the files a UI serves by path, keeping only the newest `keep` of them.

    Each `write` gets a folder of its own (names repeat across users, files never clash); older folders beyond
    `keep` are removed, and the whole folder when the process exits. Safe to share between threads.
    """

    def __init__(self, keep: int = KEEP_DOWNLOADS, prefix: str = "explainer-downloads-") -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self._folder = tempfile.TemporaryDirectory(prefix=prefix)
        self._lock = threading.Lock()
        self._written = 0  # sub-folders are named by this counter, so their names sort oldest first

    @property
    def root(self) -> Path:
        return Path(self._folder.name)

    def write(self, data: str | bytes, filename: str) -> Path:
        """Write `data` as `filename` (made safe as in `write_download`) in a fresh sub-folder; prune old ones."""
        with self._lock:
            self._written += 1
            path = write_download(data, filename, tempfile.mkdtemp(prefix=f"{self._written:012d}-", dir=self.root))
            folders = sorted(self.root.iterdir(), key=lambda f: f.name)  # not mtime: a clock tick holds several
            for old in folders[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def cleanup(self) -> None:
        """Remove the folder now (otherwise it goes when the process exits)."""
        self._folder.cleanup()


FOLDER = DownloadFolder()  # the process's download folder


def download(data: str | bytes, filename: str) -> dict:
    """A DownloadButton update serving `data` as `filename`."""
    return gr.update(value=str(FOLDER.write(data, filename)), interactive=True)


def served_image(image: Image.Image, cache: str | os.PathLike | None = None) -> str:
    """The path of `image` as a PNG in Gradio's cache, named by its content and written once, atomically.

    Gradio saves an image handed to it as a PIL object by rewriting its content-named file in place, every time,
    so the same picture sent twice (a step's view drawn again, the reliance pass's update) truncates the file while
    a browser may be reading it: the transfer fails ("Too little data for declared Content-Length") and the page
    keeps a broken image, since its address has not changed. A path inside the cache Gradio serves as it is.

    Args:
        image: the picture to show.
        cache: the cache folder (default: Gradio's, where Blocks keep served files and `delete_cache` ages them).
    """
    data = png_bytes(image)
    folder = Path(cache if cache is not None else get_upload_folder()) / hashlib.sha256(data).hexdigest()
    path = folder / "image.png"
    try:
        os.utime(path)  # there already: `delete_cache` ages files by their ctime, so one shown again is kept as new
        return str(path)
    except FileNotFoundError:  # not there, or aged out by `delete_cache` just now: written below
        pass
    return str(write_atomically(path, data))  # readers see the whole file or none


def no_file() -> dict:
    """A DownloadButton update: nothing to download (no result yet, or a view the file cannot show)."""
    return gr.update(value=None, interactive=False)


def has_steps(attr: object) -> bool:
    """Whether `attr` is a result with answer tokens to export."""
    return isinstance(attr, Attribution) and attr.num_steps > 0


def exported_methods(attr: Attribution, methods: list[str] | None) -> list[str]:
    """The ticked methods the result has scores for, else all of its methods."""
    return [m for m in (methods or []) if m in attr.methods] or list(attr.methods)
