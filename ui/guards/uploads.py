"""The one gate through which every handler opens a file a visitor sent: an upload of this process, or one of the
app's own example files; anything else is refused with `REFUSED`, the same message whether the path exists or not.

Every event of the page can be called directly through Gradio's queue by its `fn_index`, private ones included, with
any JSON in place of a widget's value. Gradio checks a file payload only when it carries `meta: {"_type":
"gradio.FileData"}` and only after launch (`processing_utils._check_allowed`), and events run with
`preprocess=False` (the image tab's) get the raw payload: a bare `{"path": "/etc/..."}` reaches the handler. So no
handler opens a path itself; it asks `uploaded_path` (or `requests.open_image`, which does) first.

The rule: the path, resolved with `os.path.realpath` (so `..`, symlinks out and relative paths are seen for what
they are), must be a regular file that

- Gradio's `/upload` route wrote in this process (`Blocks.upload_file_set` of every `watch`ed app, the paths it
  returned to the uploader), or
- one of the app's own example files (`add_examples`), or the copy Gradio serves of one from its cache folder
  (`<upload folder>/<hash_file(example)>/<name>`, where `gr.Examples` puts it and from where a clicked example is
  sent back).

Why per process and not per visit is enough: `/upload` stores a file at `<upload folder>/<sha256(seed + bytes)>/
<name>`, where the seed is the server's own (`gradio/hash_seed.txt`, random per install). Naming another visitor's
upload needs its exact bytes and the server's seed; someone who has the bytes learns nothing from reading them back,
and the seed never leaves the server. A visitor can therefore only open what they uploaded or could have uploaded,
without tying each upload to a session (Gradio keeps no such record: `upload_file_set` is one set per app).

Inline `data:` URLs sent through the API open no file and need no gate (`requests.open_image` decodes them). A
payload naming a web address is refused too: Gradio fetches it into its cache (not into `upload_file_set`), and
opening it would let a caller read addresses only the server can reach, returned as an overlay.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Set
from pathlib import Path
from typing import Any

from gradio.processing_utils import hash_file
from gradio.utils import get_upload_folder
from gradio_client.utils import strip_invalid_filename_characters

from explainer.errors import InputError

REFUSED = (
    "This app opens only files uploaded to it: upload the file again, or pick an example "
    "(through the API: gradio_client.handle_file of a local file)."
)

_uploads: list[Set[str]] = []  # each watched app's `Blocks.upload_file_set`, filled by its /upload route
_examples: set[str] = set()  # real paths of the app's example files and of their copies in Gradio's cache


def watch(upload_file_set: Set[str]) -> None:
    """Accept the files that an app's `/upload` route records in `upload_file_set` (its `Blocks.upload_file_set`,
    read live at each check)."""
    if not any(upload_file_set is seen for seen in _uploads):
        _uploads.append(upload_file_set)


def add_examples(paths: Iterable[str | Path]) -> None:
    """Accept the app's own example files (as `gr.Examples` shows them: the file and Gradio's cached copy)."""
    for path in paths:
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            continue
        _examples.add(real)
        name = strip_invalid_filename_characters(Path(real).name)
        _examples.add(os.path.realpath(Path(get_upload_folder()) / hash_file(real) / name))


def _accepted(real: str) -> bool:
    if real in _examples:
        return True
    if any(real in files for files in _uploads):  # Gradio records real absolute paths: the common case
        return True
    return any(real == os.path.realpath(path) for files in _uploads for path in list(files))


def uploaded_path(payload: Any) -> Path:
    """The real path of an uploaded file, from Gradio's payload (a dict with `path`) or a path.

    Raises:
        InputError: `REFUSED`, for anything but a regular file this process received by upload or an example file:
            a missing file, a directory, a path outside the uploads (however spelled), a payload without a path.
    """
    path = payload.get("path") if isinstance(payload, dict) else payload
    if not isinstance(path, str | Path) or not str(path) or "\x00" in str(path):
        raise InputError(REFUSED)
    real = os.path.realpath(path)
    if not _accepted(real) or not os.path.isfile(real):
        raise InputError(REFUSED)
    return Path(real)
