"""The current view as a PNG: the side-by-side prompt heatmaps of one step, drawn with Pillow (no browser).

Same content and colours as `visuals.heatmap.side_by_side_html`: the step caption, one panel per method titled
with its name and time, the shown prompt tokens wrapped into lines as boxes coloured by the same bins (`bin_class`,
`bin_color`), white text on dark bins, strong red tokens drawn bold, and the z-score legend. The width is bounded;
the height grows with the prompt, and past `max_tokens` tokens a panel ends with "… N more tokens".

The font is Pillow's bundled scalable font (`ImageFont.load_default(size)`) so the image is the same wherever it
is drawn, with no system fonts; it covers ASCII and a few symbols, so other characters (accents, CJK, emoji) show
as boxes. Whitespace is made visible in ASCII (`\\n` before a line break, `\\t`), control and bidi-format
characters become `?`.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw

from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step
from visuals.efficiency import _font
from visuals.heatmap import (
    _BOLD_BIN,
    _STRONG_BIN,
    BINS,
    _auto_zmax,
    _scope_caption,
    _step_caption,
    _view,
    bin_class,
    bin_color,
    no_scores_label,
)
from visuals.overlay import overlay_grid

MAX_TOKENS = 400  # tokens drawn per panel; the rest are counted ("… N more tokens")
MIN_PANEL_WIDTH = 300  # as the HTML grid's minmax(300px, 1fr)

_TEXT_RGB = (31, 35, 40)
_MUTED_RGB = (87, 96, 106)
_BORDER_RGB = (208, 215, 222)
_NAN_RGB = (230, 230, 230)
_FONT_SIZE = 13
_PAD = 10  # around the image and inside panels
_GAP = 10  # between panels
_BOX_PAD = 2  # left and right of a token's text inside its box
_LINE = _FONT_SIZE + 9  # line height of the token flow


def _rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in css[css.index("(") + 1 : css.index(")")].split(","))
    return r, g, b


def _label(token: str) -> tuple[str, bool]:
    """Drawable text of a token and whether a line break follows it."""
    if token == "":
        return "''", False
    breaks = token.endswith("\n")
    text = token.replace("\r", "").replace("\n", "\\n").replace("\t", "\\t")
    text = "".join("?" if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return text, breaks


def _fit(draw: ImageDraw.ImageDraw, text: str, font: Any, width: float) -> str:
    """`text`, cut with an ellipsis so that it is at most `width` pixels wide."""
    if draw.textlength(text, font=font) <= width:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # longest prefix that fits with "…"
        mid = (lo + hi + 1) // 2
        if draw.textlength(text[:mid] + "…", font=font) <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + "…"


def _layout(
    draw: ImageDraw.ImageDraw, attr: Attribution, view: Any, zmax: float, width: int, font: Any, max_tokens: int
) -> tuple[list[tuple[int | None, str, str, tuple[int, int, int, int]]], int, int]:
    """Token boxes of one panel from (0, 0): (prompt position or None for a gap, text, bin class, box), the panel's
    content height and the number of tokens left out."""
    boxes = []
    x = y = 0
    prev = None
    positions = view.positions.tolist()
    shown = positions[:max_tokens]
    for i, p in enumerate(shown):
        items = []
        if prev is not None and p != prev + 1:
            items.append((None, " … ", "xh", False))
        prev = p
        text, breaks = _label(attr.prompt_tokens[p])
        z = float(view.z[i])
        css = "" if view.step is None else bin_class(z, zmax)
        items.append((p, text, css, breaks))
        for pos, label, css_class, line_break in items:
            label = _fit(draw, label, font, width - 2 * _BOX_PAD)
            w = math.ceil(draw.textlength(label, font=font)) + 2 * _BOX_PAD + (1 if _bold(css_class) else 0)
            if x > 0 and x + w > width:
                x, y = 0, y + _LINE
            boxes.append((pos, label, css_class, (x, y, x + w, y + _LINE - 3)))
            x += w
            if line_break:
                x, y = 0, y + _LINE
    height = (y + (_LINE if x > 0 else 0)) if boxes else 0
    return boxes, height, len(positions) - len(shown)


def _bold(css: str) -> bool:
    return len(css) > 1 and css[0] == "r" and css[1:].isdigit() and int(css[1:]) >= _BOLD_BIN


def _draw_box(draw: ImageDraw.ImageDraw, origin: tuple[int, int], box: tuple, font: Any) -> None:
    pos, label, css, (x0, y0, x1, y1) = box
    ox, oy = origin
    if css == "xh":
        draw.text((ox + x0 + _BOX_PAD, oy + y0 + 2), label, fill=_MUTED_RGB, font=font)
        return
    if css:
        draw.rounded_rectangle((ox + x0, oy + y0, ox + x1 - 1, oy + y1), radius=3, fill=_rgb(bin_color(css)))
    strong = css[:1] in ("r", "b") and int(css[1:]) >= _STRONG_BIN
    fill = (255, 255, 255) if strong else _TEXT_RGB
    draw.text((ox + x0 + _BOX_PAD, oy + y0 + 2), label, fill=fill, font=font)
    if _bold(css):  # the bundled font has no bold face: draw it twice, one pixel apart
        draw.text((ox + x0 + _BOX_PAD + 1, oy + y0 + 2), label, fill=fill, font=font)


def _legend(draw: ImageDraw.ImageDraw, x: int, y: int, zmax: float, font: Any) -> None:
    draw.text((x, y + 1), "z-score", fill=_TEXT_RGB, font=font)
    x0 = x + math.ceil(draw.textlength("z-score", font=font)) + 10
    cell = 12
    classes = [f"b{b}" for b in range(BINS, 0, -1)] + [""] + [f"r{b}" for b in range(1, BINS + 1)]
    for i, css in enumerate(classes):
        draw.rectangle((x0 + i * cell, y + 2, x0 + (i + 1) * cell - 1, y + 13), fill=_rgb(bin_color(css)))
    x1 = x0 + len(classes) * cell
    draw.rectangle((x0 - 1, y + 1, x1, y + 14), outline=_BORDER_RGB)
    small = _font(_FONT_SIZE - 2)
    for value, at in ((-zmax, x0), (0.0, (x0 + x1) / 2), (zmax, x1)):
        text = "0" if value == 0 else f"{value:+.2f}"
        draw.text((at, y + 16), text, fill=_TEXT_RGB, font=small, anchor="ma")
    draw.text(
        (x1 + 14, y + 1),
        "red, bold: more important than average · blue: less",
        fill=_MUTED_RGB,
        font=font,
    )


def _draw_view(
    attr: Attribution,
    methods: Sequence[str],
    step: int | None = None,
    user_only: bool = True,
    width: int = 1200,
    max_tokens: int = MAX_TOKENS,
    image: Any = None,
    alpha: float = 0.5,
) -> tuple[Image.Image, dict[str, list]]:
    """`view_png` and the token boxes it drew: method -> [(prompt position, text, bin class, (x0, y0, x1, y1))]."""
    width = min(max(int(width), 480), 2400)
    methods = list(methods)
    font, title_font = _font(_FONT_SIZE), _font(_FONT_SIZE + 1)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    views = [_view(attr, m, step, user_only) for m in methods]
    scored = [v for v in views if v.step is not None]
    zmax = _auto_zmax(scored)
    caption = _caption(attr, step, scored) if methods else "Select at least one attribution method."
    inner = width - 2 * _PAD
    cols = max(1, min(len(methods), (inner + _GAP) // (MIN_PANEL_WIDTH + _GAP)))
    panel_w = (inner - (cols - 1) * _GAP) // cols
    content_w = panel_w - 2 * _PAD
    layouts = [_layout(probe, attr, v, zmax, content_w, font, max(int(max_tokens), 1)) for v in views]
    caption_lines = _wrap(probe, caption, font, inner)
    shows_image = image is not None and attr.image and scored
    overlay = _overlay(attr, methods, step, image, alpha, inner) if shows_image else None
    y = _PAD + (overlay.height + _GAP if overlay is not None else 0)
    y_caption = y
    y += len(caption_lines) * (_FONT_SIZE + 6) + 6
    title_h = _FONT_SIZE + 12
    panel_tops, row_heights = [], []
    for r in range(math.ceil(len(methods) / cols)):
        row = layouts[r * cols : (r + 1) * cols]
        h = max(title_h + lh + (_LINE if more else 0) for _, lh, more in row) + 2 * _PAD
        panel_tops.append(y)
        row_heights.append(h)
        y += h + _GAP
    legend_y = y
    height = legend_y + (34 if scored else 0) + _PAD
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    if overlay is not None:
        img.paste(overlay, (_PAD, _PAD))
    for i, line in enumerate(caption_lines):
        draw.text((_PAD, y_caption + i * (_FONT_SIZE + 6)), line, fill=_TEXT_RGB, font=font)
    boxes_by_method = {}
    for i, (method, view, layout) in enumerate(zip(methods, views, layouts)):
        r, c = divmod(i, cols)
        frame = (_PAD + c * (panel_w + _GAP), panel_tops[r], panel_w, row_heights[r])
        boxes_by_method[method] = _draw_panel(draw, attr, method, view, layout, frame, (font, title_font))
    if scored:
        _legend(draw, _PAD, legend_y, zmax, font)
    return img, boxes_by_method


def _overlay(
    attr: Attribution, methods: list[str], step: int | None, image: Any, alpha: float, inner: int
) -> Image.Image:
    """The image overlays of the methods in a row above the panels, at most `inner` pixels wide."""
    overlay = overlay_grid(image, attr, methods, step, alpha=alpha, max_side=max(120, inner // max(len(methods), 1)))
    if overlay.width > inner:
        overlay = overlay.resize((inner, max(1, round(overlay.height * inner / overlay.width))), Image.BICUBIC)
    return overlay


def _caption(attr: Attribution, step: int | None, scored: list) -> str:
    """The step caption of the HTML view, with the token in the font's ASCII."""
    header_step = clamp_step(step, attr.num_steps)  # None only before the first token
    if header_step is None:
        caption = _step_caption(attr, None, attr.num_steps)
    else:
        token = attr.generated_tokens[header_step] if header_step < len(attr.generated_tokens) else ""
        caption = f"Step {header_step + 1} of {attr.num_steps} explains the token '{_label(token)[0]}'"
    return caption + (f" · {_scope_caption(scored[0])}" if scored else "")


def _draw_panel(draw: ImageDraw.ImageDraw, attr: Attribution, method: str, view: Any, layout: tuple,
                frame: tuple[int, int, int, int], fonts: tuple[Any, Any]) -> list:  # fmt: skip
    """Draw one method's panel in `frame` = (x0, y0, width, height); returns its token boxes in image coordinates."""
    (boxes, _, more), (x0, y0, panel_w, panel_h), (font, title_font) = layout, frame, fonts
    draw.rounded_rectangle((x0, y0, x0 + panel_w - 1, y0 + panel_h - 1), radius=6, outline=_BORDER_RGB)
    scores = attr.methods.get(method)
    scored = scores is not None and view.step is not None
    detail = f"{scores.seconds:.2f} s" if scored else no_scores_label(attr, method)
    name = _fit(draw, _label(method)[0], title_font, (panel_w - 2 * _PAD) * 0.7)
    draw.text((x0 + _PAD, y0 + _PAD), name, fill=_TEXT_RGB, font=title_font)
    draw.text((x0 + _PAD + 1, y0 + _PAD), name, fill=_TEXT_RGB, font=title_font)  # bold by a 1-pixel offset
    name_w = math.ceil(draw.textlength(name, font=title_font)) + 1
    draw.text((x0 + _PAD + name_w, y0 + _PAD), f" · {detail}", fill=_MUTED_RGB, font=title_font)
    origin = (x0 + _PAD, y0 + _PAD + _FONT_SIZE + 12)  # below the title
    for box in boxes:
        _draw_box(draw, origin, box, font)
    if more:
        last = max((b[3][3] for b in boxes), default=0)
        draw.text((origin[0], origin[1] + last + 6), f"… {more} more tokens", fill=_MUTED_RGB, font=font)
    return [(p, t, css, (bx0 + origin[0], by0 + origin[1], bx1 + origin[0], by1 + origin[1]))
            for p, t, css, (bx0, by0, bx1, by1) in boxes]  # fmt: skip


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: Any, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split(" "):
        candidate = f"{line} {word}" if line else word
        if line and draw.textlength(candidate, font=font) > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    return [_fit(draw, s, font, width) for s in [*lines, line]]


def view_png(
    attr: Attribution,
    methods: Sequence[str],
    step: int | None = None,
    user_only: bool = True,
    width: int = 1200,
    max_tokens: int = MAX_TOKENS,
    image: Any = None,
    alpha: float = 0.5,
) -> Image.Image:
    """The side-by-side heatmaps of one step as an image (what `side_by_side_html` shows), for a PNG download.

    Args:
        attr: the result; each method's scores are (K, N).
        methods: one panel each (a method without scores gets a "pending" panel).
        step: 0-based step; None is the last; out-of-range values are clamped.
        user_only: as in `side_by_side_html`.
        width: image width in pixels, clamped to [480, 2400]; panels sit side by side, at least 300 pixels wide.
        max_tokens: tokens drawn per panel; the rest are counted in a last line.
        image: for an image result, the PIL image asked about: `overlay_grid` of the step goes on top.
        alpha: overlay opacity.

    Returns:
        An RGB image of the given width; its height grows with the prompt. Deterministic.
    """
    return _draw_view(attr, methods, step, user_only, width, max_tokens, image, alpha)[0]
