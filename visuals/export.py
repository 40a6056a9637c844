"""Download files of a result: safe file names, PNG bytes, and files written for widgets that serve them by path.

The saved result itself (its JSON, reading it back with clear errors) is `explainer/result.py`'s: `result_json` and
`load_result` are re-exported here for the front ends that import them from this module.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from explainer.result import MAX_RESULT_BYTES, Attribution, load_result, result_json

__all__ = [
    "MAX_RESULT_BYTES",
    "DownloadFolder",
    "export_filename",
    "load_result",
    "png_bytes",
    "result_json",
    "write_download",
]

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def export_filename(attr: Attribution, extension: str, stem: str = "explanation") -> str:
    """A safe file name for a download: `explanation-<model>-<K>steps.<extension>` (only letters, digits, `._-`).

    Args:
        attr: the result (its model name and number of steps go into the name).
        extension: without the dot, e.g. "json", "html", "png", "gif".
        stem: the name's first part.
    """
    model = _UNSAFE_NAME.sub("-", attr.model.rsplit("/", 1)[-1]).strip("-.")[:60] or "model"
    ext = _UNSAFE_NAME.sub("", extension.lstrip("."))[:10] or "dat"
    return f"{_UNSAFE_NAME.sub('-', stem).strip('-.') or 'explanation'}-{model}-{attr.num_steps}steps.{ext}"


def png_bytes(image: Any) -> bytes:
    """A PIL image as PNG file bytes (deterministic: no timestamps or text chunks)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def write_download(data: str | bytes, filename: str, directory: str | os.PathLike | None = None) -> Path:
    """Write one download to a file of its own, for widgets that serve files by path (`gr.DownloadButton`).

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
    `keep` are removed, and the whole folder when the process exits. Gradio copies a returned file into its own cache
    before the reply is sent, so only the newest few are ever needed again. Safe to share between threads.
    """

    def __init__(self, keep: int = 32, prefix: str = "explainer-downloads-") -> None:
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
