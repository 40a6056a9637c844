"""Saving a result and opening it again: the JSON of the CLI format, file names and bytes, and loading with clear
errors. Writing files is the UI's (`ui/downloads.py`): this module stays pure.

`result_json` writes exactly the layout of `Attribution.to_dict` (what `explain --json` writes and `load_json`
reads), with each score written as the shortest decimal that reads back to the same float32 (about half the size
of float64 digits; reloading gives bit-identical scores, so every view of a reloaded result equals the original's).
NaN scores are written as `NaN`, as `to_dict` does (Python's reader accepts it; strict JSON readers do not).

`load_result` opens such a file from the app's upload (bytes or a path) and turns every way it can be wrong into an
`InputError` a user can act on: too large, not UTF-8, not JSON, not a saved result (the field named).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from explainer.errors import InputError
from explainer.result import Attribution

# A saved result of the app's largest usual request (2,000 prompt tokens x 200 steps x 4 methods, raw and z) is
# about 35 MB in this file's compact form and 60 MB as float64 digits; parsing holds about five times the file in
# Python objects, so 64 MiB (~350 MB while loading) stays well within a Space's memory and refuses anything larger.
MAX_RESULT_BYTES = 64 * 2**20

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _compact_matrix(a: np.ndarray) -> list[list[float]]:
    """(K, N) float32 -> nested lists of floats printed with the shortest digits that read back to the same float32."""
    a = np.asarray(a, dtype=np.float32)  # (K, N)
    # numpy prints float32 with its shortest round-trip repr; parsing that text as float64 gives a float whose repr
    # is at most as long and which converts back to the same float32. Row by row: the text array is 128 bytes a cell.
    return [row.astype(str).astype(np.float64).tolist() for row in a]


def result_dict(attr: Attribution) -> dict[str, Any]:
    """`attr.to_dict()` with the score matrices in compact float form (same layout, same values as float32)."""
    d = attr.to_dict()
    for name, m in d["methods"].items():
        scores = attr.methods[name]
        m["raw"] = _compact_matrix(scores.raw)
        m["z"] = _compact_matrix(scores.z)
    return d


def result_json(attr: Attribution) -> str:
    """The result as JSON text in the CLI's layout (`explain --json`, `Attribution.load_json`).

    Args:
        attr: any result; score matrices are (K, N) per method.

    Returns:
        One line of JSON; `load_result` / `Attribution.load_json` read it back to a result with bit-identical
        scores, tokens and metadata.
    """
    return json.dumps(result_dict(attr), ensure_ascii=False, separators=(",", ":"))


def _size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n} bytes"


def _read(source: bytes | bytearray | str | os.PathLike, max_bytes: int) -> tuple[bytes, str]:
    """The file's bytes and a name for messages; refuses a missing, unreadable or too large file."""
    if isinstance(source, bytes | bytearray | memoryview):
        data, what = bytes(source), "The uploaded file"
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        what = f"The file {path.name!r}"
        try:
            if path.is_dir():
                raise InputError(f"{str(path)!r} is a folder; choose a saved result (.json) file.")
            size = path.stat().st_size
            if size > max_bytes:
                raise InputError(
                    f"{what} is {_size_text(size)}; a saved result can be at most {_size_text(max_bytes)}."
                )
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"The saved result {str(path)!r} does not exist.") from None
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            raise InputError(f"Cannot read the saved result {str(path)!r}: {getattr(e, 'strerror', None) or e}.") from e
    else:
        raise InputError(f"A saved result is given as bytes or a file path, got {type(source).__name__}.")
    if len(data) > max_bytes:
        raise InputError(f"{what} is {_size_text(len(data))}; a saved result can be at most {_size_text(max_bytes)}.")
    if not data.strip():
        raise InputError(f"{what} is empty; choose a result saved with 'Download JSON' or `explain --json`.")
    return data, what


def load_result(source: bytes | bytearray | str | os.PathLike, max_bytes: int = MAX_RESULT_BYTES) -> Attribution:
    """A result saved as JSON (by `result_json`, the app's download, `explain --json` or `save_json`).

    Args:
        source: the file's content as bytes, or the path of the file (str or Path; what an upload widget gives).
        max_bytes: largest file accepted (default `MAX_RESULT_BYTES`, 64 MiB).

    Returns:
        The result, checked field by field (`Attribution.from_dict`): every view can show it without a model.

    Raises:
        InputError: the file is missing, too large, empty, not UTF-8 text, not JSON, or not a saved result (the
            message names the field).
    """
    data, what = _read(source, max_bytes)
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark from a Windows editor is harmless
    except UnicodeDecodeError as e:
        raise InputError(
            f"{what} is not UTF-8 text (byte {e.start + 1} is 0x{data[e.start]:02x}); a saved result is a .json file."
        ) from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{what} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); a saved result is the .json file "
            "that 'Download JSON' or `explain --json` writes."
        ) from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to be a saved result.") from None
    return Attribution.from_dict(parsed)


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
