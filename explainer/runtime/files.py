"""A file written whole or not at all (`write_atomically`), for files that someone may read while they are written:
a data set another run is loading, a picture a browser is being served."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike, data: bytes) -> Path:
    """`data` into `path` through a staging file in the same folder (`.NAME.` and a random tail), renamed over `path`
    at the end: a reader sees the whole old file, the whole new one, or none, never a part; a write that fails
    leaves no staging file behind. Returns `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(staging, target)  # atomic within one file system
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return target
