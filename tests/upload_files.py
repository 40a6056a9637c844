"""Tiny image files as users upload them: broken ones (with the message they must get) and odd but valid formats
(with the RGB pixel they must give). Built in the test's tmp_path; none is over a few kilobytes. `uploaded` records
a file as Gradio's /upload route does (`Blocks.upload_file_set`), so the handlers' file gate (`ui/guards/uploads.py`)
lets it through; every file `write` makes is recorded so."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from ui.guards import uploads

UPLOADED: set[str] = set()  # what the /upload route of an app would have recorded
uploads.watch(UPLOADED)


def png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims a size but whose pixel data is missing (what a huge or truncated file looks like)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


def noise(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _truncated(path: Path) -> None:
    noise(64, 48).save(path)
    path.write_bytes(path.read_bytes()[:200])


def _corrupt(path: Path) -> None:
    noise(64, 48).save(path)
    data = bytearray(path.read_bytes())
    for i in range(100, len(data) - 20, 7):  # flip bytes in the pixel data, keep the header
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _truncated_jpeg(path: Path) -> None:
    noise(64, 48).save(path, "JPEG")
    path.write_bytes(path.read_bytes()[:300])


# file name -> (writer, the message's distinctive part as a regex)
BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated.png": (_truncated, "damaged or truncated"),
    "truncated.jpg": (_truncated_jpeg, "damaged or truncated"),
    "corrupt.png": (_corrupt, "damaged or truncated"),
    "notes.png": (lambda p: p.write_text("not an image at all\n"), "not an image file"),
    "empty.png": (lambda p: p.write_bytes(b""), "empty file"),
    "huge.png": (lambda p: png_header_only(p, 30_000, 30_000), "too large|the limit is"),
    "108mp.png": (lambda p: png_header_only(p, 12_000, 9_000), "too large|the limit is"),
    "tiny.png": (lambda p: noise(3, 3).save(p), "at least 8 pixels"),
    "elongated.png": (lambda p: noise(1000, 8).save(p), "aspect ratio"),
    "missing.png": (lambda p: None, "does not exist"),
}


def _animated(path: Path, fmt: str) -> None:
    frames = [Image.new("RGB", (20, 12), c) for c in ("red", "blue", "lime")]
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)


def _grey16(path: Path) -> None:
    Image.fromarray(np.full((12, 20), 32896, dtype=np.uint16)).save(path)  # 32896 / 257 = 128


def _float_tiff(path: Path) -> None:
    a = np.zeros((12, 20), dtype=np.float32)
    a[:, 10:] = 0.5  # left half the minimum, right half the maximum
    Image.fromarray(a).save(path)


# file name -> (writer, mode Pillow opens it in, the RGB pixel at (0, 0) after loading, tolerance)
ODD: dict[str, tuple[Callable[[Path], None], str, tuple[int, int, int], int]] = {
    "cmyk.jpg": (lambda p: Image.new("CMYK", (20, 12), (0, 255, 255, 0)).save(p, quality=95), "CMYK", (255, 0, 0), 8),
    "grey16.png": (_grey16, "I;16", (128, 128, 128), 0),
    "float.tiff": (_float_tiff, "F", (0, 0, 0), 0),
    "palette.png": (
        lambda p: Image.new("RGB", (20, 12), (200, 30, 30)).convert("P", palette=Image.ADAPTIVE).save(p),
        "P",
        (200, 30, 30),
        0,
    ),
    "palette-transparent.png": (
        lambda p: Image.new("P", (20, 12), 0).save(p, transparency=0),
        "P",
        (255, 255, 255),
        0,
    ),  # transparent: white
    "grey-alpha.png": (lambda p: Image.new("LA", (20, 12), (100, 255)).save(p), "LA", (100, 100, 100), 0),
    "clear-rgba.png": (lambda p: Image.new("RGBA", (20, 12), (255, 0, 0, 0)).save(p), "RGBA", (255, 255, 255), 0),
    "bilevel.png": (lambda p: Image.new("1", (20, 12), 1).save(p), "1", (255, 255, 255), 0),
    "animated.gif": (lambda p: _animated(p, "GIF"), "P", (255, 0, 0), 0),  # the first frame
    "animated.png": (lambda p: _animated(p, "PNG"), "RGB", (255, 0, 0), 0),
}


def write(directory: Path, name: str) -> Path:
    """Write the file `name` of `BROKEN` or `ODD` into `directory` and return its path."""
    path = directory / name
    (BROKEN.get(name) or ODD[name])[0](path)
    return uploaded(path)


def uploaded(path: Path | str) -> Path:
    """`path`, recorded as an upload of this process (as Gradio's /upload route records the files it stores)."""
    UPLOADED.add(os.path.realpath(path))
    return Path(path)
