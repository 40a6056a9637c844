"""Opening and checking the images a question is about: any file Pillow reads becomes an 8-bit RGB image, and every
way an upload can be wrong (not an image, truncated, empty, huge, tiny, a strip) gives a one-line `InputError`.

`vision.encode_image_prompt` and the front ends (the image tab's upload, the CLI's `--image`) open images here.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ..errors import InputError

MIN_IMAGE_SIDE = 8  # pixels; smaller images carry no spatial information worth explaining
MAX_IMAGE_PIXELS = 80_000_000  # refuse larger files before decoding them (a 12-megapixel photo is fine)
MAX_ASPECT_RATIO = 100  # the Qwen resizer refuses ratios above 200; stay clear of it with a readable message


def load_image(image: str | Path | bytes | Image.Image, name: str | None = None) -> Image.Image:
    """Open and check an image: 8-bit RGB, EXIF orientation applied, neither tiny nor huge.

    Every pixel format becomes RGB: palette, grey, CMYK and YCbCr through Pillow; 16- and 32-bit grey and float
    images scaled to 8 bits (Pillow would clip them at 255, turning most of the image white); transparency
    composited onto white. Animated images (GIF, APNG, WebP) give their first frame, silently: the model sees one
    still image.

    Args:
        image: a file path, the file's bytes, or a PIL image.
        name: how messages name the image (default: its path, or "The image").

    Raises:
        InputError: one line saying what is wrong: missing or empty file, not an image, damaged or truncated data,
            an unconvertible pixel format, too small, too large or too elongated.
    """
    if isinstance(image, Image.Image):
        return _checked_rgb(image, f"Image {name!r}" if name else "The image")
    if isinstance(image, bytes | bytearray):
        label, source, size = f"Image {name!r}" if name else "The image", io.BytesIO(image), len(image)
    elif not isinstance(image, str | os.PathLike):
        raise InputError(f"Expected an image file path, its bytes or a PIL image, got {type(image).__name__}.")
    else:
        path = Path(image)
        label = f"Image {name or str(path)!r}"
        if not path.is_file():
            raise InputError(f"{label} does not exist or is not a file.")
        source, size = path, path.stat().st_size
    if size == 0:
        raise InputError(f"{label} is an empty file (0 bytes): upload it again.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")  # corrupt data: we say so
            with Image.open(source) as img:
                return _checked_rgb(img, label)
    except InputError:
        raise
    except Image.UnidentifiedImageError as e:
        raise InputError(f"{label} is not an image file this app can read (PNG, JPEG, GIF, WebP, BMP, TIFF).") from e
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"{label} is too large: at most {MAX_IMAGE_PIXELS:,} pixels. Downscale it.") from e
    except PermissionError as e:
        raise InputError(f"{label} cannot be read: {_one_line(e)}") from e
    except Exception as e:  # Pillow's parsers raise OSError, ValueError, SyntaxError, struct.error... on bad data
        raise InputError(f"{label} is damaged or truncated and cannot be decoded: {_one_line(e)}") from e


def data_url_bytes(url: str) -> bytes:
    """The bytes of a base64 `data:` URL (how an image sent inline through the app's API arrives).

    Raises:
        InputError: not a base64 data: URL.
    """
    head, sep, body = url.partition(",")
    if not (head.startswith("data:") and head.endswith(";base64") and sep):
        raise InputError("The image was sent as a data: URL that is not base64 (expected data:<type>;base64,<data>).")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InputError("The image was sent as a data: URL that is not valid base64.") from e


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _checked_rgb(img: Image.Image, label: str) -> Image.Image:
    w, h = img.size
    if w * h > MAX_IMAGE_PIXELS:  # checked on the header, before decoding
        raise InputError(f"{label} has {w}x{h} pixels; the limit is {MAX_IMAGE_PIXELS:,} pixels. Downscale it.")
    try:
        img.load()
    except Exception as e:  # Pillow's decoders raise OSError, ValueError, SyntaxError, struct.error... on bad data
        raise InputError(f"{label} is damaged or truncated and cannot be decoded: {_one_line(e)}") from e
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # unreadable orientation metadata: keep the pixels as stored
        pass
    img = _to_rgb(img, label)
    w, h = img.size
    if min(w, h) < MIN_IMAGE_SIDE:
        raise InputError(f"{label} is {w}x{h} pixels; each side needs at least {MIN_IMAGE_SIDE} pixels.")
    if max(w, h) / min(w, h) > MAX_ASPECT_RATIO:
        raise InputError(f"{label} is {w}x{h} pixels; its aspect ratio must stay below {MAX_ASPECT_RATIO}:1.")
    return img


def _to_rgb(img: Image.Image, label: str) -> Image.Image:
    """A new 8-bit RGB image of any Pillow mode (see `load_image`)."""
    mode = img.mode
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float64)  # (H, W)
        if mode.startswith("I;16"):
            a = a / 257.0  # 0..65535 -> 0..255
        else:  # 32-bit integers or floats have no fixed range: stretch their own range
            finite = a[np.isfinite(a)]
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
            a = np.nan_to_num(a, nan=lo, posinf=hi, neginf=lo)
            a = (a - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(a)
        a = np.clip(np.nan_to_num(a), 0.0, 255.0)  # a range too wide for float64 gives inf / inf
        return Image.fromarray(np.round(a).astype(np.uint8)).convert("RGB")  # (H, W) uint8 is grey
    try:
        if img.has_transparency_data:
            rgba = img.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
        return img.convert("RGB")
    except (ValueError, OSError) as e:
        raise InputError(f"{label} uses the pixel format {mode}, which cannot be converted to RGB.") from e
