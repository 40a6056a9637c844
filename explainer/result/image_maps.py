"""Image maps of an `Attribution` (MACS paper, Appendix B).

Pure numpy + PIL: no model. A step's image map is the row of scores at the image-token positions, z-scored over
those positions only and reshaped to the merged patch grid; it is upsampled smoothly to the image's pixels.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .attribution import Attribution, zscore
from .sinks import leave_out_sinks, sink_positions


def image_map(attr: Attribution, method: str, step: int, hide_sinks: bool = False, index: int = 0) -> np.ndarray:
    """Z-scores of one step over the image tokens, on the merged patch grid of image `index`.

    Args:
        attr: a result with `attr.image` set (an image prompt).
        method: method name in `attr.methods`.
        step: 0-based generated-token index; negative counts from the end.
        hide_sinks: leave the image tokens that are attention sinks (`sinks.sink_positions`) out of the z-scores.
        index: which image (`attr.images`); with several, the z-scores are taken over the tokens of all of them, so
            the maps of the images are on one scale.

    Returns:
        (h, w) float32 z-scores re-normalised over the image tokens (zeros when all are equal); with `hide_sinks`,
        over the other image tokens, NaN at the sinks.

    Raises:
        ValueError: the result has no image, or the method no scores.
    """
    if not attr.image:
        raise ValueError("This result has no image: it comes from a text prompt.")
    z = image_zscores(attr, method, step, hide_sinks)  # (T,)
    record = _record(attr, index)
    start = sum(len(one["token_positions"]) for one in attr.images[:index])
    h, w = record["grid"]
    return z[start : start + h * w].reshape(h, w).astype(np.float32)


def image_zscores(attr: Attribution, method: str, step: int, hide_sinks: bool = False) -> np.ndarray:
    """(T,) float64 z-scores of one step over the tokens of every image, image after image (NaN at sinks left out
    with `hide_sinks`); `image_map` reshapes one image's part to its grid."""
    if method not in attr.methods:
        raise ValueError(f"No scores for method {method!r}; have {', '.join(attr.methods) or 'none'}.")
    raw = attr.methods[method].raw  # (K, N)
    if raw.shape[0] == 0:
        raise ValueError(f"Method {method!r} has no steps yet.")
    pos = np.asarray(attr.image_token_positions, dtype=np.int64)  # (T,) every image's tokens
    row = np.asarray(raw[step], dtype=np.float64)  # (N,)
    finite = np.isfinite(row[pos])
    values = np.where(finite, row[pos], 0.0)[None, :]  # (1, T)
    cells = np.flatnonzero(np.isin(pos, sink_positions(attr))) if hide_sinks else []  # sink tokens among them
    return leave_out_sinks(values, cells)[0] if len(cells) else zscore(values)[0]


def _record(attr: Attribution, index: int) -> dict:
    if not 0 <= index < len(attr.images):
        raise ValueError(f"No image {index + 1}: this result has {len(attr.images)}.")
    return attr.images[index]


def image_sinks(attr: Attribution, index: int = 0) -> np.ndarray:
    """(h, w) bool: the merged-grid cells of image `index` whose image token is an attention sink (all False
    without sinks)."""
    if not attr.image:
        raise ValueError("This result has no image: it comes from a text prompt.")
    record = _record(attr, index)
    h, w = record["grid"]
    pos = np.asarray(record["token_positions"], dtype=np.int64)  # (h * w,)
    return np.isin(pos, sink_positions(attr)).reshape(h, w)


def upsample_map(grid_map: np.ndarray, size: tuple[int, int], resample: int = Image.BICUBIC) -> np.ndarray:
    """Smoothly resize a (h, w) map to `size` = (W, H) pixels: (H, W) float32.

    The processor stretches the whole image onto the grid (no crop), so the grid maps onto the full image.
    """
    m = np.asarray(grid_map, dtype=np.float32)  # (h, w)
    return np.asarray(Image.fromarray(m, mode="F").resize(tuple(size), resample=resample), dtype=np.float32)
