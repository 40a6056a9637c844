"""Region -> answer tokens, drawn: which answer tokens used the selected image region or words.

`region_figure` is a small bar chart, one group of bars per answer token and one bar per method, of the mean z-score
over the selection (`result.regions`); the step on the slider is marked. `grid_picker` draws the image with its
merged patch grid and the selected cells, for the visitor to click cells on.

Pure: results and images in, a Plotly figure or a PIL image out; no model.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image, ImageDraw

from explainer.result.attribution import Attribution
from explainer.result.regions import Cell
from visuals.curves import method_colors
from visuals.heatmap import visible_whitespace

PICKER_SIDE = 360  # pixels of the picker's longer side: small images are enlarged so their cells can be clicked
_GRID_RGB = (255, 255, 255)
_SELECTED_RGB = (0, 200, 255)  # cyan, as the overlays' outline
_CORNER_RGB = (255, 200, 0)


def region_figure(attr: Attribution, strengths: Mapping[str, np.ndarray], step: int | None = None) -> go.Figure:
    """Bars of each method's (K,) strengths over the answer tokens; `step` (0-based) is marked.

    Args:
        attr: the result (its answer tokens label the x axis).
        strengths: method -> (K,) mean z-score over the selection per step (NaN: no score at that step).
        step: the step on the slider, or None.
    """
    tokens = [html.escape(visible_whitespace(t, spaces=False), quote=False) for t in attr.generated_tokens]
    labels = [f"{i + 1}: {t}" for i, t in enumerate(tokens)]  # numbered: repeated tokens stay apart
    colors = method_colors(list(strengths))
    fig = go.Figure()
    for method, values in strengths.items():
        y = np.asarray(values, dtype=np.float64)[: len(labels)]
        fig.add_bar(
            x=labels[: y.size], y=np.where(np.isfinite(y), y, None), name=method, marker_color=colors[method],
            hovertemplate=f"{method}<br>%{{x}}<br>mean z %{{y:.2f}}<extra></extra>",
        )  # fmt: skip
    if step is not None and 0 <= step < len(labels):
        fig.add_vrect(x0=step - 0.5, x1=step + 0.5, fillcolor="rgba(0,200,255,0.15)", line_width=0)
    fig.add_hline(y=0, line_width=1, line_color="#888")
    fig.update_layout(
        barmode="group", height=300, margin={"l": 40, "r": 10, "t": 30, "b": 60},
        yaxis_title="mean z-score of the selection", legend={"orientation": "h", "y": 1.12},
        xaxis={"tickangle": -45, "type": "category"},
    )  # fmt: skip
    return fig


def picker_size(size: Sequence[int], side: int = PICKER_SIDE) -> tuple[int, int]:
    """The picker's (W, H) for an image of `size` (W, H): its longer side `side`, the aspect kept."""
    width, height = int(size[0]), int(size[1])
    scale = side / max(width, height, 1)
    return max(1, round(width * scale)), max(1, round(height * scale))


def grid_picker(
    image: Image.Image, grid: Sequence[int], cells: Iterable[Cell] = (), corner: Cell | None = None
) -> Image.Image:
    """The image at `picker_size`, its (h, w) grid drawn, selected cells tinted, a pending corner outlined."""
    h, w = (int(v) for v in grid)
    size = picker_size(image.size)
    out = image.convert("RGB").resize(size, Image.BILINEAR)
    tint = Image.new("RGB", size, _SELECTED_RGB)
    mask = Image.new("L", size, 0)
    draw_mask = ImageDraw.Draw(mask)
    for r, c in cells:
        draw_mask.rectangle(_cell_box(r, c, h, w, size), fill=110)
    out = Image.composite(tint, out, mask)
    draw = ImageDraw.Draw(out)
    for i in range(1, w):
        x = round(i * size[0] / w)
        draw.line([(x, 0), (x, size[1])], fill=_GRID_RGB, width=1)
    for i in range(1, h):
        y = round(i * size[1] / h)
        draw.line([(0, y), (size[0], y)], fill=_GRID_RGB, width=1)
    if corner is not None:
        draw.rectangle(_cell_box(*corner, h, w, size), outline=_CORNER_RGB, width=3)
    return out


def _cell_box(r: int, c: int, h: int, w: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    x0, x1 = round(c * size[0] / w), round((c + 1) * size[0] / w) - 1
    y0, y1 = round(r * size[1] / h), round((r + 1) * size[1] / h) - 1
    return x0, y0, x1, y1
