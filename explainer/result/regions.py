"""Region -> answer tokens: how strongly each answer token drew on a chosen part of the prompt.

The per-token maps answer "which inputs did this answer token use?". The reverse question, "which answer tokens used
this part of the image (or these words)?", reads the same scores along the other axis: for each step, the mean of the
step's z-scores (MACS paper, Eq. 8) over the chosen prompt positions. The z-scores are taken over the positions the
view standardises over (the image's tokens for an image region, the user's text for words), so a region's value is
in the units of the map the visitor sees: 0 is an average token, +1 one standard deviation above.

A region of an image is a set of cells of its merged patch grid (`Attribution.image["grid"]` = (h, w), one image
token per cell, `token_positions` in row-major order), picked one by one or as the cells a rectangle touches.

Pure numpy: no model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import InputError
from .attribution import Attribution, zscore
from .segments import word_groups
from .spans import shown_positions

Cell = tuple[int, int]  # (row, column) of the merged patch grid


def _grid(image: dict) -> tuple[int, int, float, float]:
    """(h, w) of the grid and the image's (W, H) pixels."""
    h, w = (int(v) for v in image["grid"])
    width, height = (float(v) for v in image["size"])
    return h, w, width, height


def cell_at(image: dict, x: float, y: float) -> Cell:
    """The grid cell under pixel (x, y) of the image (its original size), clamped to the grid."""
    h, w, width, height = _grid(image)
    row = min(max(int(y * h / height), 0), h - 1)
    col = min(max(int(x * w / width), 0), w - 1)
    return row, col


def cells_in_box(corner: Cell, other: Cell) -> list[Cell]:
    """Every cell of the rectangle with these two corner cells, row-major."""
    (r0, c0), (r1, c1) = corner, other
    rows = range(min(r0, r1), max(r0, r1) + 1)
    cols = range(min(c0, c1), max(c0, c1) + 1)
    return [(r, c) for r in rows for c in cols]


def cell_positions(image: dict, cells: Iterable[Cell]) -> list[int]:
    """The prompt positions of the image tokens of these cells, ascending.

    Raises:
        InputError: a cell outside the grid.
    """
    h, w, _, _ = _grid(image)
    tokens = list(image["token_positions"])  # (h * w,) row-major
    out = set()
    for r, c in cells:
        if not (0 <= r < h and 0 <= c < w):
            raise InputError(f"Cell ({r}, {c}) is outside the image's {h} x {w} grid.")
        out.add(int(tokens[r * w + c]))
    return sorted(out)


def region_strength(attr: Attribution, method: str, positions: Sequence[int], over: Sequence[int]) -> np.ndarray:
    """How strongly each answer token drew on `positions`: per step, the mean z-score over them.

    Args:
        attr: the result.
        method: a method in `attr.methods`.
        positions: the region's prompt positions (a subset of `over`).
        over: the positions each step's scores are z-scored over (the view's: image tokens or the user's text).

    Returns:
        (K,) float32; NaN at a step without scores (a method that failed there).

    Raises:
        InputError: no positions, positions outside `over`, or a method without scores.
    """
    if method not in attr.methods:
        raise InputError(f"No scores for method {method!r}; this result has {', '.join(attr.methods) or 'none'}.")
    region = np.unique(np.asarray(list(positions), dtype=np.int64))
    population = np.unique(np.asarray(list(over), dtype=np.int64))
    if region.size == 0:
        raise InputError("Select part of the image (or some words) first.")
    if not np.isin(region, population).all():
        raise InputError("The selection is not part of the tokens this view scores.")
    raw = attr.methods[method].raw  # (K, N)
    finite = np.isfinite(raw[:, population]).all(axis=1)  # (K,) steps the method scored
    z = zscore(np.where(np.isfinite(raw), raw, 0.0), population)[:, region]  # (K, r)
    return np.where(finite, z.astype(np.float64).mean(axis=1), np.nan).astype(np.float32)


def region_strengths(
    attr: Attribution, methods: Sequence[str], positions: Sequence[int], over: Sequence[int]
) -> dict[str, np.ndarray]:
    """`region_strength` for each of `methods` that `attr` has, in order."""
    return {m: region_strength(attr, m, positions, over) for m in methods if m in attr.methods}


def image_region_strengths(
    attr: Attribution, methods: Sequence[str], cells: Iterable[Cell], index: int = 0
) -> dict[str, np.ndarray]:
    """Per method, (K,) mean z-score over the cells' image tokens of image `index`, z-scored over the tokens of
    every image, as the overlays are."""
    if not attr.image:
        raise InputError("This result has no image: select words of the question instead.")
    if not 0 <= index < len(attr.images):
        raise InputError(f"No image {index + 1}: this result has {len(attr.images)}.")
    return region_strengths(attr, methods, cell_positions(attr.images[index], cells), attr.image_token_positions)


def word_choices(attr: Attribution) -> list[tuple[str, list[int]]]:
    """The user's words a visitor can select, in order: (label "index: word", their prompt positions); whitespace
    and chat-template tokens left out. The label's index keeps repeated words apart."""
    shown, _ = shown_positions(attr, True)
    words = [g for g in word_groups(attr.prompt_tokens, shown) if g.kind in ("word", "punct")]
    return [(f"{i + 1}: {g.text.strip()}", list(g.positions)) for i, g in enumerate(words)]


def word_region_strengths(attr: Attribution, methods: Sequence[str], labels: Sequence[str]) -> dict[str, np.ndarray]:
    """Per method, (K,) mean z-score over the chosen words' tokens (labels from `word_choices`), z-scored over the
    user's text as the token heatmap.

    Raises:
        InputError: no words chosen, or a label that is not one of this result's words.
    """
    choices = dict(word_choices(attr))
    unknown = [label for label in labels if label not in choices]
    if unknown:
        raise InputError(f"{unknown[0]!r} is not a word of this prompt; choose from the list.")
    positions = sorted({p for label in labels for p in choices[label]})
    over, _ = shown_positions(attr, True)
    return region_strengths(attr, methods, positions, over)
