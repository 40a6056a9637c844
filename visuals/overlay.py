"""Image overlays of an `Attribution` from an image prompt: one step's image map on top of the image.

Pure functions (`Attribution`, PIL image -> PIL image). The map is the step's scores at the image tokens, z-scored
over those tokens (`result.image_maps.image_map`), upsampled bicubically to the image's pixels, scaled to [0, 1]
per map (lowest -> dark, highest -> bright), coloured with an inferno-like perceptual colormap and blended with the
image. Optionally the top p% of pixels are outlined. With `hide_sinks`, image tokens that are attention sinks are
left out of the z-scores and the colour scale, and their cells are hatched grey over the image. Steps are 0-based;
None is the newest; out-of-range steps are clamped.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from explainer.result.attribution import Attribution
from explainer.result.image_maps import image_map, image_sinks, image_zscores, upsample_map
from explainer.result.steps import clamp_step
from visuals.heatmap import no_scores_label

# Nine stops approximating matplotlib's 'inferno' (perceptually uniform, dark to bright, readable in grey).
_INFERNO = np.array(
    [
        (0, 0, 4),
        (31, 12, 72),
        (85, 15, 109),
        (136, 34, 106),
        (186, 54, 85),
        (227, 89, 51),
        (249, 140, 10),
        (249, 201, 50),
        (252, 255, 164),
    ],
    dtype=np.float32,
)
_CONTOUR_RGB = (0, 255, 255)  # cyan: stands out on every inferno colour
_SINK_RGB, _SINK_STRIPE_RGB = (200, 200, 200), (110, 110, 110)  # a sink cell: light grey with darker stripes
_SINK_STRIPE = 6  # pixels per stripe period (half dark, half light)
_LABEL_HEIGHT = 18  # pixels of the caption strip above each small multiple


def colormap(t: np.ndarray) -> np.ndarray:
    """Map values in [0, 1] to RGB with the inferno-like LUT: (...,) -> (..., 3) uint8 (NaN -> black)."""
    t = np.clip(np.nan_to_num(np.asarray(t, dtype=np.float32), nan=0.0), 0.0, 1.0)
    x = t * (len(_INFERNO) - 1)
    i = np.minimum(x.astype(np.int64), len(_INFERNO) - 2)
    f = (x - i)[..., None]
    rgb = _INFERNO[i] * (1.0 - f) + _INFERNO[i + 1] * f  # (..., 3)
    return np.round(rgb).astype(np.uint8)


def _step(attr: Attribution, method: str, step: int | None) -> int:
    shown = clamp_step(step, attr.methods[method].raw.shape[0] if method in attr.methods else 0)
    if shown is None:
        raise ValueError(f"No scores for method {method!r} yet.")
    return shown


def heat_map(
    attr: Attribution, method: str, step: int | None, size: tuple[int, int], hide_sinks: bool = False, index: int = 0
) -> np.ndarray:
    """The step's map of image `index` upsampled to `size` = (W, H) and scaled to [0, 1]: (H, W) float32. Sink
    cells left out (`hide_sinks`) count as average (z = 0) here; `image_overlay` hatches them. With several images
    the scale spans the z-scores of all of them, so brighter is more in every image."""
    k = _step(attr, method, step)
    grid = np.nan_to_num(image_map(attr, method, k, hide_sinks, index), nan=0.0)  # (h, w), sinks left out: 0
    heat = upsample_map(grid, size)  # (H, W)
    lo, hi = float(heat.min()), float(heat.max())
    if len(attr.images) > 1:
        every = np.nan_to_num(image_zscores(attr, method, k, hide_sinks), nan=0.0)  # (T,) all images, as the grids
        lo, hi = float(every.min()), float(every.max())
        return np.clip((heat - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.zeros_like(heat)  # bicubic overshoots
    return (heat - lo) / (hi - lo) if hi > lo else np.zeros_like(heat)


def cell_pixels(cells: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(h, w) bool grid cells -> (H, W) bool pixels of `size` = (W, H) that they cover (the grid spans the image)."""
    h, w = cells.shape
    rows = np.minimum(np.arange(size[1]) * h // size[1], h - 1)  # (H,) grid row of each pixel row
    cols = np.minimum(np.arange(size[0]) * w // size[0], w - 1)  # (W,)
    return cells[rows[:, None], cols[None, :]]


def _hatch(pixels: np.ndarray, mask: np.ndarray) -> None:
    """Paint diagonal grey stripes over `mask` (H, W) of `pixels` (H, W, 3) float32, in place."""
    y, x = np.indices(mask.shape)
    dark = ((x + y) // (_SINK_STRIPE // 2)) % 2 == 0  # (H, W)
    pixels[mask & dark] = _SINK_STRIPE_RGB
    pixels[mask & ~dark] = _SINK_RGB


def _outline(region: np.ndarray) -> np.ndarray:
    """Boundary pixels of a boolean region, two pixels wide: (H, W) bool."""
    padded = np.pad(region, 1, mode="edge")
    inner = region.copy()
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
        inner &= padded[dy : dy + region.shape[0], dx : dx + region.shape[1]]
    edge = region & ~inner
    thick = np.pad(edge, 1)
    return edge | thick[2:, 1:-1] | thick[:-2, 1:-1] | thick[1:-1, 2:] | thick[1:-1, :-2]


def image_overlay(
    image: Image.Image,
    attr: Attribution,
    method: str,
    step: int | None = None,
    alpha: float = 0.5,
    contour_top_percent: float | None = None,
    hide_sinks: bool = False,
    index: int = 0,
) -> Image.Image:
    """The image with one step's attribution map blended on top (image `index` of several).

    Args:
        image: the image the prompt asked about (any mode; any size, ideally `attr.image["size"]`).
        attr: result of an image prompt (`attr.image` set).
        method: method name.
        step: 0-based generated-token index; None is the newest.
        alpha: opacity of the colour map in [0, 1].
        contour_top_percent: outline the brightest p% of pixels (e.g. 10); None draws no outline.
        hide_sinks: leave the image's attention sinks out of the map's z-scores and colours; their cells are
            hatched grey and never outlined.

    Returns:
        RGB image of the same size as `image`.
    """
    base = image.convert("RGB")
    heat = heat_map(attr, method, step, base.size, hide_sinks, index)  # (H, W) in [0, 1]
    a = float(np.clip(alpha, 0.0, 1.0))
    pixels = np.asarray(base, dtype=np.float32)  # (H, W, 3)
    out = (1.0 - a) * pixels + a * colormap(heat).astype(np.float32)
    sinks = cell_pixels(image_sinks(attr, index), base.size) if hide_sinks else np.zeros(heat.shape, dtype=bool)
    _hatch(out, sinks)
    if contour_top_percent is not None and 0 < contour_top_percent < 100:
        scored = heat[~sinks] if not sinks.all() else heat.ravel()
        region = (heat >= np.percentile(scored, 100.0 - float(contour_top_percent))) & ~sinks
        if region.any() and not region.all():
            out[_outline(region)] = _CONTOUR_RGB
    return Image.fromarray(np.round(out).astype(np.uint8), mode="RGB")


def overlay_grid(
    image: Image.Image | Sequence[Image.Image],
    attr: Attribution,
    methods: Sequence[str],
    step: int | None = None,
    alpha: float = 0.5,
    contour_top_percent: float | None = None,
    max_side: int = 320,
    hide_sinks: bool = False,
) -> Image.Image:
    """Small multiples: one labelled overlay per method for the same step, side by side; with several images (a
    list, in the result's order) one such row per image, one under the other.

    Methods without scores get a grey tile saying why (`no_scores_label`). Each tile is scaled so its longer side is
    `max_side`.
    `hide_sinks` is `image_overlay`'s; the labels then say how many sinks each map leaves out.

    Returns:
        RGB image of width len(methods) * tile width (+ gaps) and height tile height + a caption strip (per row).
    """
    images = list(image) if isinstance(image, list | tuple) else [image]
    if len(images) != len(attr.images):
        raise ValueError(f"{len(images)} images given for a result about {len(attr.images)}.")
    if len(images) == 1:
        return _overlay_row(images[0], attr, methods, step, alpha, contour_top_percent, max_side, hide_sinks)
    rows = [
        _overlay_row(img, attr, methods, step, alpha, contour_top_percent, max_side, hide_sinks, i)
        for i, img in enumerate(images)
    ]
    gap = 10
    canvas = Image.new(
        "RGB", (max(r.width for r in rows), sum(r.height for r in rows) + gap * (len(rows) - 1)), "white"
    )
    y = 0
    for row in rows:
        canvas.paste(row, (0, y))
        y += row.height + gap
    return canvas


def _overlay_row(
    image: Image.Image, attr: Attribution, methods: Sequence[str], step: int | None, alpha: float,
    contour_top_percent: float | None, max_side: int, hide_sinks: bool, index: int | None = None,
) -> Image.Image:  # fmt: skip
    """`overlay_grid` of one image (`index` of several, named in the labels; None: the only one)."""
    methods = list(methods)
    which = 0 if index is None else index
    prefix = "" if index is None else f"image {index + 1} · "
    base = image.convert("RGB")
    scale = min(1.0, max_side / max(base.size))
    tile = base.resize((max(1, round(base.width * scale)), max(1, round(base.height * scale))), Image.BICUBIC)
    gap = 6
    canvas = Image.new("RGB", (max(1, len(methods)) * (tile.width + gap) - gap, tile.height + _LABEL_HEIGHT), "white")
    draw = ImageDraw.Draw(canvas)
    left_out = int(image_sinks(attr, which).sum()) if hide_sinks else 0
    sinks = f" · {left_out} sink{'s' if left_out > 1 else ''} hatched" if left_out else ""
    for i, method in enumerate(methods):
        x = i * (tile.width + gap)
        try:
            k = _step(attr, method, step)
            panel = image_overlay(tile, attr, method, k, alpha, contour_top_percent, hide_sinks, which)
            token = attr.generated_tokens[k] if k < len(attr.generated_tokens) else ""
            label = f"{prefix}{method} · step {k + 1} {token!r}{sinks}"
        except ValueError:
            panel = Image.new("RGB", tile.size, (220, 220, 220))
            label = f"{prefix}{method} · {no_scores_label(attr, method)}"
        canvas.paste(panel, (x, _LABEL_HEIGHT))
        draw.text((x + 2, 3), _fitted(draw, label[:60], tile.width - 4), fill=(31, 35, 40))
    return canvas


def _fitted(draw: ImageDraw.ImageDraw, label: str, width: int) -> str:
    """`label` shortened with "…" until it fits `width` pixels (it would run into the next tile)."""
    if draw.textlength(label) <= width:
        return label
    while label and draw.textlength(label + "…") > width:
        label = label[:-1]
    return label + "…"


def _gif(frames: list[Image.Image], frame_ms: int) -> bytes:
    """Looping GIF bytes of same-sized RGB frames, the last held three times as long.

    One palette shared by all frames keeps colours steady (per-frame palettes flicker); it is fitted on up to eight
    frames spread over the sequence, stacked into one image.
    """
    sample = frames[:: max(1, len(frames) // 8)][:8]
    montage = Image.new("RGB", (frames[0].width, frames[0].height * len(sample)))
    for i, frame in enumerate(sample):
        montage.paste(frame, (0, i * frames[0].height))
    palette = montage.quantize(colors=255, method=Image.Quantize.MEDIANCUT)
    quantized = [f.quantize(palette=palette, dither=Image.Dither.NONE) for f in frames]
    durations = [int(frame_ms)] * (len(frames) - 1) + [3 * int(frame_ms)]
    buffer = io.BytesIO()
    quantized[0].save(buffer, format="GIF", save_all=True, append_images=quantized[1:], duration=durations, loop=0)
    return buffer.getvalue()


MAX_GIF_FRAMES = 48  # frames kept in `gif_bytes`, spread evenly over the steps
MAX_GIF_WIDTH = 960  # pixels: wider grids get smaller tiles


def gif_steps(num_steps: int, max_frames: int = MAX_GIF_FRAMES) -> list[int]:
    """The steps a GIF shows: all of them, or `max_frames` spread evenly from the first to the last."""
    max_frames = max(int(max_frames), 1)
    if num_steps <= max_frames:
        return list(range(num_steps))
    if max_frames == 1:
        return [num_steps - 1]
    return sorted({round(i * (num_steps - 1) / (max_frames - 1)) for i in range(max_frames)})


def gif_bytes(
    image: Image.Image | Sequence[Image.Image],
    attr: Attribution,
    methods: Sequence[str],
    alpha: float = 0.5,
    contour_top_percent: float | None = None,
    max_side: int = 240,
    frame_ms: int = 600,
    max_frames: int = MAX_GIF_FRAMES,
    max_width: int = MAX_GIF_WIDTH,
) -> bytes:
    """An animated GIF of the image overlays over the steps, bounded in frames and size (for a download).

    Frame i is `overlay_grid` (one labelled overlay per method) of step `gif_steps(K, max_frames)[i]`; each tile's
    longer side is `max_side` pixels, smaller when the methods side by side would be wider than `max_width`.

    Returns:
        The GIF file's bytes: at most `max_frames` frames of at most `max_width` pixels, looping, one shared
        palette, the last frame held three times as long.

    Raises:
        ValueError: the result has no steps or none of `methods` has scores.
    """
    methods = [m for m in methods if m in attr.methods and attr.methods[m].raw.shape[0] > 0]
    if not methods or attr.num_steps == 0:
        raise ValueError("nothing to animate: the result has no steps for these methods")
    gap = 6  # as overlay_grid
    side = max(16, min(int(max_side), (int(max_width) + gap) // len(methods) - gap))
    frames = [
        overlay_grid(image, attr, methods, k, alpha, contour_top_percent, side)
        for k in gif_steps(attr.num_steps, max_frames)
    ]
    return _gif(frames, frame_ms)
