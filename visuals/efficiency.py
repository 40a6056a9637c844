"""Pure views of benchmark rows: throughput and peak memory against prompt length, as Plotly (HTML) or a PNG.

Rows are the plain dicts of a `bench --json` report (`method`, `prompt_tokens`, `tokens_per_s`, `peak_mem_mb`);
nothing here touches a model. `none` (plain generation) is drawn dashed, as the reference every method is compared to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go
from PIL import Image, ImageDraw, ImageFont
from plotly.subplots import make_subplots

from .curves import method_colors

BASELINE = "none"
BASELINE_COLOR = "#333333"
PANELS = (
    ("tokens_per_s", "throughput (tokens/s), higher is better"),
    ("peak_mem_mb", "peak memory (MiB), lower is better"),
)


def series(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, float, float]]]:
    """Per method, its (prompt tokens, tokens/s, peak MiB) points sorted by length; the baseline first.

    Raises:
        ValueError: a row lacks one of the needed fields.
    """
    out: dict[str, dict[int, tuple[int, float, float]]] = {}
    for r in rows:
        try:
            point = (int(r["prompt_tokens"]), float(r["tokens_per_s"]), float(r["peak_mem_mb"]))
            out.setdefault(str(r["method"]), {})[point[0]] = point  # a later row of the same length wins
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"benchmark row without method/prompt_tokens/tokens_per_s/peak_mem_mb: {r!r}") from e
    names = sorted(out, key=lambda m: (m != BASELINE, list(out).index(m)))
    return {m: sorted(out[m].values()) for m in names}


def efficiency_figure(rows: Iterable[Mapping[str, Any]], title: str = "") -> go.Figure:
    """Two panels, throughput and peak memory vs prompt tokens (log axis), one line per method."""
    data = series(rows)
    colors = method_colors(list(data), BASELINE, BASELINE_COLOR)
    fig = make_subplots(rows=1, cols=2, subplot_titles=[label for _, label in PANELS])
    lengths = sorted({n for points in data.values() for n, _, _ in points})
    for m, points in data.items():
        for col, (field, _) in enumerate(PANELS, start=1):
            y = [p[1] if field == "tokens_per_s" else p[2] for p in points]
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in points],
                    y=y,
                    mode="lines+markers",
                    name="plain generation" if m == BASELINE else m,
                    legendgroup=m,
                    showlegend=col == 1,
                    line={"color": colors[m], "width": 2, "dash": "dash" if m == BASELINE else "solid"},
                    hovertemplate=f"{m}<br>%{{x}} prompt tokens<br>%{{y:.3g}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    for col in (1, 2):
        fig.update_xaxes(type="log", tickvals=lengths, title_text="prompt tokens", row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(title=title or None, template="plotly_white", height=420, margin={"t": 70})
    return fig


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow built without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _nice_max(value: float) -> tuple[float, float]:
    """An axis maximum >= value and a tick step, both 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1.0, 0.2
    raw = value / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(s * power for s in (1, 2, 5, 10) if s * power >= raw)
    return step * math.ceil(value / step), step


def _polyline(draw: ImageDraw.ImageDraw, xy: list[tuple[float, float]], color: str, dashed: bool) -> None:
    """A series' line (dashed: short segments along each piece) and its points."""
    if len(xy) > 1 and not dashed:
        draw.line(xy, fill=color, width=2)
    elif len(xy) > 1:
        for (ax, ay), (bx, by) in zip(xy, xy[1:]):
            pieces = max(int(math.hypot(bx - ax, by - ay) // 8), 1)
            for s in range(0, pieces, 2):
                t0, t1 = s / pieces, min((s + 1) / pieces, 1.0)
                seg = [(ax + (bx - ax) * t0, ay + (by - ay) * t0), (ax + (bx - ax) * t1, ay + (by - ay) * t1)]
                draw.line(seg, fill=color, width=2)
    for x, y in xy:
        draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)


def efficiency_png(rows: Iterable[Mapping[str, Any]], title: str = "", width: int = 1100, height: int = 440):
    """The same two panels as `efficiency_figure`, drawn with Pillow (for a README; no browser needed).

    Returns:
        PIL.Image in RGB mode of size (width, height).
    """
    data = series(rows)
    colors = method_colors(list(data), BASELINE, BASELINE_COLOR)
    lengths = sorted({n for points in data.values() for n, _, _ in points})
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    small, normal = _font(12), _font(15)
    top = 40 if title else 16
    if title:
        draw.text((width // 2, 8), title, fill="black", font=normal, anchor="ma")
    legend_h = 24
    panel_w = (width - 40) // 2
    for index, (field, label) in enumerate(PANELS):
        x0, x1 = 20 + index * panel_w + 60, 20 + (index + 1) * panel_w - 20
        y0, y1 = top + 24, height - 50 - legend_h
        draw.text(((x0 + x1) // 2, top), label, fill="black", font=normal, anchor="ma")
        values = [p[1] if field == "tokens_per_s" else p[2] for points in data.values() for p in points]
        y_max, step = _nice_max(max(values, default=1.0))
        lo, hi = math.log(min(lengths, default=1)), math.log(max(lengths, default=2))
        span = hi - lo or 1.0

        def px(n: float, lo=lo, span=span, x0=x0, x1=x1) -> float:
            return x0 + (x1 - x0) * (0.5 if len(lengths) < 2 else (math.log(n) - lo) / span)

        def py(v: float, y_max=y_max, y0=y0, y1=y1) -> float:
            return y1 - (y1 - y0) * v / y_max

        for i in range(round(y_max / step) + 1):
            v = i * step
            draw.line([(x0, py(v)), (x1, py(v))], fill="#e6e6e6")
            draw.text((x0 - 6, py(v)), f"{v:g}", fill="#444444", font=small, anchor="rm")
        for n in lengths:
            draw.line([(px(n), y1), (px(n), y1 + 4)], fill="#444444")
            draw.text((px(n), y1 + 6), str(n), fill="#444444", font=small, anchor="ma")
        draw.text(((x0 + x1) // 2, y1 + 22), "prompt tokens (log scale)", fill="#444444", font=small, anchor="ma")
        draw.rectangle([x0, y0, x1, y1], outline="#888888")
        for m, points in data.items():
            xy = [(px(p[0]), py(p[1] if field == "tokens_per_s" else p[2])) for p in points]
            _polyline(draw, xy, colors[m], dashed=m == BASELINE)
    x = 80
    for m in data:
        name = "plain generation" if m == BASELINE else m
        ly = height - legend_h
        draw.line([(x, ly + 6), (x + 22, ly + 6)], fill=colors[m], width=3)
        draw.text((x + 28, ly + 6), name, fill="black", font=small, anchor="lm")
        x += 40 + int(draw.textlength(name, font=small))
    return img
