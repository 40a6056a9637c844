"""A self-contained HTML report of one result: one file that works offline, with a step slider.

The page holds the side-by-side prompt heatmaps of `visuals.heatmap.side_by_side_html` (same stylesheet, colour
bins and legend), the answer strip, a header with the model, date and each method's time and options, and, for
image results given their image, the image overlays. No CDN, no web font, no network: the styles and a small inline
script are in the file (written in `static/report.css` and `static/report.js`, package data), and images are `data:`
URIs.

The scores are embedded once, as JSON in `<script type="application/json" id="xai-data">`, per method and step
exactly as the panels show them (the user's tokens re-normalised, or all tokens): `z` rounded to 2 decimals (the
precision of the hover titles), `bins` the colour bin of each token as one character (`0` white, `1`-`8` red,
`a`-`h` blue, `.` no score), so the script only copies classes and titles and every step looks as the app showed it.
Row K (after the K steps) is the mean of each token's z over all steps ("mean over all steps").

Image results given their image: one `overlay_grid` PNG (all methods side by side, longer side `image_max_side`
pixels per method) per step, for at most `max_image_frames` steps spread evenly over the answer; a step without its
own frame shows the nearest stored one and says so.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import json
import math
import re
import string
import unicodedata
import warnings
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np

from explainer.contrast import contrasted_steps, is_blank
from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step
from visuals.export import png_bytes
from visuals.heatmap import (
    _CARD,
    _FLOW,
    _MUTED,
    _SELECTED,
    _TEXT,
    _TOKEN,
    _auto_zmax,
    _legend_html,
    _quoted,
    _scope_caption,
    _step_caption,
    _token_text_html,
    _View,
    _view,
    bin_class,
    side_by_side_html,
)
from visuals.overlay import gif_steps, overlay_grid

MAX_IMAGE_FRAMES = 64  # overlay PNGs kept per report (about 20-60 KB each at the default size)
IMAGE_MAX_SIDE = 240  # longer side of each method's overlay in the report, pixels

_BIN_CHARS = (
    {"": "0", "xg": "."} | {f"r{b}": str(b) for b in range(1, 9)} | {f"b{b}": "abcdefgh"[b - 1] for b in range(1, 9)}
)


@functools.cache
def _static(name: str) -> str:
    """A file of the package's `static/` folder (shipped as package data)."""
    return resources.files("visuals").joinpath("static", name).read_text(encoding="utf-8")


def report_style() -> str:
    """The page's stylesheet, `static/report.css`, comments dropped and the shared colours filled in."""
    css = re.sub(r"/\*.*?\*/\s*", "", _static("report.css"), flags=re.S)
    return string.Template(css).substitute(text=_TEXT, muted=_MUTED, selected=_SELECTED).replace("\n", "")


def report_script() -> str:
    """The slider's script, `static/report.js`, without its leading comment lines."""
    return "\n".join(line for line in _static("report.js").splitlines() if not line.startswith("//")).strip()


def _clean(text: str) -> str:
    """Control and format characters (bidi overrides included) as U+FFFD: a token's right-to-left override must not
    turn the rest of a caption around."""
    return "".join(
        "\ufffd" if unicodedata.category(ch) in ("Cc", "Cf", "Cs") and ch not in "\n\t" else ch for ch in text
    )


def _text(value: Any, limit: int = 300) -> str:
    """Escaped, cleaned text for the page, cut at `limit` characters."""
    s = value if isinstance(value, str) else str(value)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(_clean(s), quote=True)


def _value_text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "none"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int | str):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _script_json(data: Any) -> str:
    """JSON that is safe inside a <script> element: no `<`, `>` or `&` can close it or open a comment."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _z2(z: float) -> float | None:
    """A z-score as its hover title shows it (2 decimals, sign of -0.00 kept); None for no score."""
    return float(f"{z:.2f}") if math.isfinite(z) else None


def _row(view_z: np.ndarray, zmax: float) -> tuple[list[float | None], str]:
    zs = view_z.tolist()
    return [_z2(z) for z in zs], "".join(_BIN_CHARS[bin_class(z, zmax)] for z in zs)


def _method_views(attr: Attribution, method: str, user_only: bool) -> tuple[list[_View], _View] | None:
    """One method's view of every step and of the mean over all steps; None without scores."""
    k, scores = attr.num_steps, attr.methods.get(method)
    if scores is None or scores.raw.shape[0] == 0 or k == 0:
        return None
    views = [_view(attr, method, s, user_only) for s in range(k)]
    for s in contrasted_steps(attr):  # no map where the method cannot be contrastive: shown as "no score"
        if is_blank(attr, method, s) and s < k:
            views[s] = dataclasses.replace(views[s], z=np.full_like(views[s].z, np.nan))
    own = np.stack([v.z for v in views[: scores.raw.shape[0]]])  # (K_m, n) distinct rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a token never scored: mean of nothing is NaN
        mean_z = np.nanmean(own.astype(np.float64), axis=0).astype(np.float32)  # (n,)
    first = views[0]
    return views, _View(step=k, positions=first.positions, z=mean_z, raw=mean_z, renormalised=first.renormalised)


def report_data(
    attr: Attribution,
    methods: Sequence[str],
    user_only: bool = True,
    image: Any = None,
    max_image_frames: int = MAX_IMAGE_FRAMES,
    image_max_side: int = IMAGE_MAX_SIDE,
    alpha: float = 0.5,
) -> dict[str, Any]:
    """What the report's script needs, per view v (steps 0..K-1, then K = the mean over all steps).

    Returns:
        `{"steps": K, "methods": [...], "z": [per method: (K+1, n) z rounded to 2 decimals, None = no score; or
        None for a method without scores], "bins": [per method: K+1 strings of n bin characters, or None],
        "legend": [K+1 indices into "legends"], "legends": [legend HTML], "captions": [K+1 texts],
        "frames": [[step, PNG data URI], ...], ...}` where n is the number of tokens shown per panel.
    """
    k = attr.num_steps
    per_method = [_method_views(attr, m, user_only) for m in methods]
    scored = [p for p in per_method if p is not None]
    zmaxes = [_auto_zmax([p[0][s] for p in scored]) for s in range(k)] + [_auto_zmax([p[1] for p in scored])]
    z_rows, bin_rows = [], []
    for p in per_method:
        if p is None:
            z_rows.append(None)
            bin_rows.append(None)
            continue
        rows = [_row(v.z, zmaxes[s]) for s, v in enumerate([*p[0], p[1]])]
        z_rows.append([r[0] for r in rows])
        bin_rows.append([r[1] for r in rows])
    legends: dict[str, int] = {}  # the legend depends on zmax only, and most steps share one (often Z_CLIP)
    legend_index = [legends.setdefault(_legend_html(zmax), len(legends)) for zmax in zmaxes]
    scope = f" · {_scope_caption(scored[0][0][0])}" if scored else ""
    captions = [_clean(_step_caption(attr, s, k)) + scope for s in range(k)] + [
        f"Mean of each token's z over all {k} steps{scope}"
    ]
    frames = []
    if image is not None and attr.image and scored and k:
        for s in gif_steps(k, max_image_frames):
            grid = overlay_grid(image, attr, methods, s, alpha=alpha, max_side=image_max_side)
            frames.append([s, "data:image/png;base64," + base64.b64encode(png_bytes(grid)).decode("ascii")])
    return {
        "version": 1,
        "steps": k,
        "methods": list(methods),
        "user_only": bool(user_only),
        "z": z_rows,
        "bins": bin_rows,
        "legend": legend_index,
        "legends": list(legends),
        "captions": captions,
        "frames": frames,
        "frameCaption": "Image regions each method credits: overlay of step {shown}{note}",
        "nearestNote": f" (the nearest stored; the report keeps {len(frames)} of {k} steps)",
    }


def _step_scores(attr: Attribution) -> dict[str, list[float]]:
    """Per-step scores of the answer tokens when the result carries them (`attr.step_scores`: "probability", "entropy"
    in nats, K values each), else {}."""
    found = getattr(attr, "step_scores", None)
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(v, list | tuple) and len(v) == attr.num_steps}


def _answer_strip(attr: Attribution, step: int | None) -> str:
    """The answer tokens, each a click target for its step; the selected one outlined by the page's stylesheet."""
    if not attr.generated_tokens:
        note = f'<div style="font-size:13px;color:{_MUTED};">No answer.</div>'
        return f'<div class="xai-answer" style="{_CARD}">{note}</div>'
    extra = _step_scores(attr)
    parts = []
    for i, token in enumerate(attr.generated_tokens):
        title = f"step {i + 1}: {_quoted(token)}"
        for name, values in extra.items():
            v = values[i]
            if isinstance(v, int | float) and not isinstance(v, bool):
                title += f" · {name} {v:.3g}{' nats' if name == 'entropy' else ''}"
        selected = ' data-selected="true"' if i == step else ""
        title = html.escape(title, quote=True)
        parts.append(
            f'<span class="xai-step" data-step="{i}"{selected} style="{_TOKEN}" title="{title}">'
            f"{_token_text_html(token)}</span>"
        )
    return f'<div class="xai-answer" style="{_CARD}"><div style="{_FLOW}">{"".join(parts)}</div></div>'


def _header(attr: Attribution, methods: Sequence[str], title: str, date: str | None, user_only: bool) -> str:
    n_user = len({p for p in attr.user_positions if 0 <= p < attr.num_prompt_tokens})
    prompt = f"{attr.num_prompt_tokens} tokens"
    if user_only and n_user:
        prompt += f"; the panels show the {n_user} tokens of the user's text, z re-normalised over them"
    else:
        prompt += "; the panels show all of them, z over all prompt tokens"
    answer = f"{attr.num_steps} tokens"
    if attr.meta.get("answer") == "given":
        answer += " (a given answer, teacher-forced)"
    rows = [("Model", attr.model)]
    if date:
        rows.append(("Date", date))
    rows += [("Prompt", prompt), ("Answer", answer)]
    if attr.image:
        sizes = ", ".join(f"{one['size'][0]} x {one['size'][1]}" for one in attr.images)
        rows.append(("Image" if len(attr.images) == 1 else f"{len(attr.images)} images", f"{sizes} pixels, "
                     f"{len(attr.image_token_positions)} image tokens"))  # fmt: skip
    details = [f"{k}: {_value_text(v)}" for k, v in attr.meta.items() if k != "status"]
    if details:
        rows.append(("Generation", "; ".join(details)))
    dl = "".join(f"<dt>{_text(k)}</dt><dd>{_text(v, 2000)}</dd>" for k, v in rows)
    method_rows = []
    for m in methods:
        scores = attr.methods.get(m)
        seconds = f"{scores.seconds:.2f} s" if scores is not None else "not computed"
        options = ", ".join(f"{k}={_value_text(v)}" for k, v in scores.meta.items()) if scores is not None else ""
        method_rows.append(f"<tr><td>{_text(m)}</td><td>{seconds}</td><td>{_text(options or '-', 1000)}</td></tr>")
    table = (
        '<table class="xai-methods"><thead><tr><th>Method</th><th>Time</th><th>Options</th></tr></thead>'
        f"<tbody>{''.join(method_rows)}</tbody></table>"
        if method_rows
        else ""
    )
    return f'<header style="{_CARD}"><h1>{_text(title)}</h1><dl>{dl}</dl>{table}</header>'


def _controls(num_steps: int, step: int | None) -> str:
    if step is None:
        return ""
    return (
        f'<section class="xai-controls" style="{_CARD}">'
        f'<label for="xai-step">Step</label><input type="range" id="xai-step" min="1" max="{num_steps}" step="1" '
        f'value="{step + 1}"><output id="xai-step-out" for="xai-step">{step + 1} / {num_steps}</output>'
        '<label><input type="checkbox" id="xai-mean"> mean over all steps</label>'
        f"<noscript>JavaScript is off: the report shows step {step + 1} only.</noscript></section>"
    )


def _figure(data: dict[str, Any], step: int | None, has_image_record: bool, image_given: bool) -> str:
    if not has_image_record:
        return ""
    if not data["frames"] or step is None:
        why = "the image was not given to the report" if not image_given else "no method has scores"
        note = f'<p style="font-size:13px;color:{_MUTED};">No overlay: {why}.</p>'
        return f'<section style="{_CARD}"><h2>Image</h2>{note}</section>'
    shown, src = min(data["frames"], key=lambda f: (abs(f[0] - step), f[0]))
    note = "" if shown == step else data["nearestNote"]
    caption = data["frameCaption"].replace("{shown}", str(shown + 1)).replace("{note}", note)
    return (
        f'<section style="{_CARD}"><h2>Image</h2><figure class="xai-figure">'
        f'<img id="xai-image" src="{src}" alt="Attribution maps over the image, one per method">'
        f'<figcaption id="xai-image-caption">{_text(caption)}</figcaption></figure></section>'
    )


def report_html(
    attr: Attribution,
    methods: Sequence[str] | None = None,
    step: int | None = None,
    user_only: bool = True,
    title: str | None = None,
    date: str | None = None,
    image: Any = None,
    max_image_frames: int = MAX_IMAGE_FRAMES,
    image_max_side: int = IMAGE_MAX_SIDE,
    alpha: float = 0.5,
) -> str:
    """One self-contained HTML page explaining a result, with a step slider; works offline.

    Args:
        attr: the result; each method's scores are (K, N).
        methods: methods to show side by side (default: all in `attr.methods`).
        step: the step shown first (0-based; None is the last); the slider moves through all K.
        user_only: as in `side_by_side_html`: only the user's tokens, z re-normalised over them.
        title: the page's heading (default "Attribution report").
        date: when the result was made, shown as given (default `attr.meta["created"]` or `["date"]` if present).
        image: for an image result (`attr.image` set), the PIL image asked about; adds the overlays per step.
        max_image_frames: most overlay frames embedded (evenly spread over the steps).
        image_max_side: longer side of each method's overlay, pixels.
        alpha: overlay opacity.

    Returns:
        The HTML document as text (write it as UTF-8). The same arguments always give the same text.
    """
    methods = list(attr.methods) if methods is None else list(methods)
    title = title or "Attribution report"
    if date is None:
        found = attr.meta.get("created", attr.meta.get("date"))
        date = found if isinstance(found, str) else None
    first = clamp_step(step, attr.num_steps)
    data = report_data(attr, methods, user_only, image, max_image_frames, image_max_side, alpha)
    has_scores = any(z is not None for z in data["z"])
    body = [
        _header(attr, methods, title, date, user_only),
        _controls(attr.num_steps, first if has_scores else None),
        f'<section style="{_CARD}"><h2>Answer</h2>{_answer_strip(attr, first)}</section>',
        _figure(data, first, bool(attr.image), image is not None),
        f'<section style="{_CARD}"><h2>Prompt tokens, coloured by each method</h2><div id="xai-view">'
        f"{side_by_side_html(attr, methods, first, user_only)}</div></section>",
    ]
    page_title = f"{title} · {attr.model}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="generator" content="explainer report 1">'
        f"<title>{_text(page_title)}</title><style>{report_style()}</style></head>"
        f'<body><main class="xai-report">{"".join(body)}</main>'
        f'<script type="application/json" id="xai-data">{_script_json(data)}</script>'
        f"<script>{report_script()}</script></body></html>\n"
    )


NOTEBOOK_HEIGHT = 640  # pixels of a notebook cell's frame; the visitor can drag it taller


def notebook_html(attr: Attribution, methods: Sequence[str] | None = None, height: int = NOTEBOOK_HEIGHT) -> str:
    """`report_html(attr, methods)` for a notebook cell (what `Attribution._repr_html_` shows, as inseq's results
    show themselves): the page in a sandboxed `<iframe srcdoc>`, so that its ids, styles and script cannot clash
    with the notebook's or with another result's report in the same notebook; its script runs, with no access to
    the notebook (`sandbox="allow-scripts"`, without same-origin).

    Returns:
        One `<iframe>` element; the report is its `srcdoc`, HTML-escaped.
    """
    page = report_html(attr, methods)
    return (
        f'<iframe class="xai-notebook" title="{_text(f"Attribution report · {attr.model}")}" sandbox="allow-scripts" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #d0d7de;border-radius:6px;resize:vertical;'
        f'overflow:auto;" srcdoc="{html.escape(page, quote=True)}"></iframe>'
    )

