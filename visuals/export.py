"""Download files of a result: safe file names and PNG bytes. Writing files is the UI's (`ui/downloads.py`): this
module stays pure.

The saved result itself (its JSON, reading it back with clear errors) is `explainer/result.py`'s: `result_json` and
`load_result` are re-exported here for the front ends that import them from this module.
"""

from __future__ import annotations

import io
import re
from typing import Any

from explainer.result.attribution import MAX_RESULT_BYTES, Attribution, load_result, result_json

__all__ = [
    "MAX_RESULT_BYTES",
    "export_filename",
    "load_result",
    "png_bytes",
    "result_json",
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
