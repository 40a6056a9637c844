"""Views of an `Attribution`: the prompt as token heatmaps side by side, the answer, a top-tokens table.

Every function is pure: it reads an `Attribution` and returns HTML or table rows. Steps are 0-based
indices into the generated tokens (`None` means the newest); out-of-range steps are clamped. The HTML is
self-contained (its own light background and text colour) so it reads the same on light and dark Gradio themes.

The heatmap HTML is re-sent on every streamed update, so a token costs as few bytes as possible (about 28 plus its
text): its colour is one of `BINS` classes per sign (`r1`..`r8` red, `b1`..`b8` blue, none for white) defined once
per fragment in a small `<style>` block, and its title is the z-score (`+1.23`) shown on hover. Attention sinks left
out of the z-scores (`hide_sinks`) are hatched (`xs`). The prompt
positions of a panel's tokens are in its `data-pos` attribute as ranges (`3-57,60-99`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from explainer.contrast import contrasted_steps, is_blank
from explainer.result.attribution import Attribution, zscore
from explainer.result.sinks import scored_positions
from explainer.result.spans import shown_positions
from explainer.result.steps import clamp_step

Z_CLIP = 3.0  # default colour range is the largest |z| shown, capped here so one outlier does not wash out the rest

# ColorBrewer RdBu, from white (z = 0) outwards; Plotly's reversed 'RdBu' uses the same colours.
_RED_STOPS = ((255, 255, 255), (253, 219, 199), (244, 165, 130), (214, 96, 77), (178, 24, 43))
_BLUE_STOPS = ((255, 255, 255), (209, 229, 240), (146, 197, 222), (67, 147, 195), (33, 102, 172))
_NAN_COLOR = "rgb(230, 230, 230)"
_SINK_BACKGROUND = "repeating-linear-gradient(135deg,#d0d7de 0 3px,#ffffff 3px 6px)"  # hatched: left out, not scored
SINK_TITLE = "attention sink: left out of the z-scores and colours"
_TEXT = "#1f2328"
_MUTED = "#57606a"
_CARD = (
    f"background:#ffffff;color:{_TEXT};border:1px solid #d0d7de;border-radius:8px;padding:10px 12px;"
    "font-family:ui-sans-serif,system-ui,-apple-system,'Segoe UI',sans-serif;"
)
_FLOW = "white-space:pre-wrap;word-break:break-word;line-height:1.9;font-size:15px;"
_TOKEN = "border-radius:3px;padding:1px 0;"
_SELECTED = "outline:2px solid #cf222e;outline-offset:1px;background-color:#fff8c5;"  # the answer token explained
_IN_SPAN = "background-color:#fff8c5;box-shadow:inset 0 -2px 0 #cf222e;"  # tokens of an explained span
LOW_PROBABILITY = 0.1  # answer tokens the model gave less than this are underlined with dots on the answer strip
_LOW = "text-decoration:underline dotted #57606a 2px;text-underline-offset:4px;"
_WHITESPACE = {"\n": "⏎", "\t": "⇥", "\r": ""}
BINS = 8  # colour steps per sign: bin round(8 |z| / zmax); finer steps are invisible at text size
_STRONG_BIN = 6  # from here on (|z| >= 0.75 zmax) the background is dark enough for white text
_BOLD_BIN = 4  # red tokens from here on (|z| >= 0.5 zmax) are also bold: colour is not the only cue


@dataclass(frozen=True)
class _View:
    """What one heatmap panel shows: the selected prompt positions and their scores at one step."""

    step: int | None  # clamped 0-based step; None when the method has no scores yet
    positions: np.ndarray  # (n,) shown prompt positions, ascending
    z: np.ndarray  # (n,) z-scores over the shown positions; NaN where unknown
    raw: np.ndarray  # (n,) the method's own scores
    renormalised: bool  # z recomputed over the user's tokens only
    sinks: np.ndarray | None = None  # (n,) bool: attention sinks left out of z (drawn hatched); None: none left out


def visible_whitespace(text: str, spaces: bool = True) -> str:
    """Make whitespace visible: newline -> ⏎, tab -> ⇥ and, when `spaces`, space -> ␣."""
    out = "".join(_WHITESPACE.get(ch, ch) for ch in text)
    return out.replace(" ", "␣") if spaces else out


def diverging_color(z: float, zmax: float) -> str:
    """CSS colour of a z-score on a symmetric blue-white-red scale over [-zmax, zmax]; grey for NaN."""
    if z is None or not math.isfinite(z):
        return _NAN_COLOR
    t = min(abs(z) / zmax, 1.0) if zmax > 0 else 0.0
    stops = _RED_STOPS if z > 0 else _BLUE_STOPS
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(stops[i], stops[i + 1], strict=True))
    return f"rgb({r}, {g}, {b})"


def bin_class(z: float, zmax: float) -> str:
    """CSS class of a z-score's colour bin: `r1`..`r8` (red, above average), `b1`..`b8` (blue), `xg` (no score) or
    "" (white: |z| below half a bin)."""
    if z is None or not math.isfinite(z):
        return "xg"
    b = min(round(abs(z) / zmax * BINS), BINS) if zmax > 0 else 0
    return "" if b == 0 else f"{'r' if z > 0 else 'b'}{b}"


def bin_color(css_class: str) -> str:
    """CSS colour of a bin class from `bin_class` (white for "")."""
    if css_class == "xg":
        return _NAN_COLOR
    if not css_class:
        return "rgb(255, 255, 255)"
    b = int(css_class[1:])
    return diverging_color(b / BINS if css_class[0] == "r" else -b / BINS, 1.0)


def _stylesheet() -> str:
    """The token classes: one background per colour bin and sign, white text on dark bins, bold strong red."""
    rules = [
        f".xai-flow{{{_FLOW}}}",
        f".xai-flow i{{font-style:normal;{_TOKEN}}}",
        ".xai-flow i[title]:hover{outline:1px solid #1f2328}",
        f".xai-flow .xg{{background:{_NAN_COLOR}}}",
        f".xai-flow .xs{{background:{_SINK_BACKGROUND};outline:1px dashed #8c959f;outline-offset:-1px}}",
        f".xai-flow .xh,.xai-flow .xe{{color:{_MUTED}}}",
    ]
    for b in range(1, BINS + 1):
        rules += [f".xai-flow .{c}{{background:{bin_color(c)}}}" for c in (f"r{b}", f"b{b}")]
    strong = ",".join(f".xai-flow .{s}{b}" for s in "rb" for b in range(_STRONG_BIN, BINS + 1))
    bold = ",".join(f".xai-flow .r{b}" for b in range(_BOLD_BIN, BINS + 1))
    rules += [f"{strong}{{color:#fff}}", f"{bold}{{font-weight:700}}"]
    return f"<style>{''.join(rules)}</style>"


_STYLE = _stylesheet()


def _view(attr: Attribution, method: str, step: int | None, user_only: bool, hide_sinks: bool = False) -> _View:
    pos, subset = shown_positions(attr, user_only)
    scores = attr.methods.get(method)
    s = clamp_step(step, 0 if scores is None else scores.raw.shape[0])
    if s is None:
        empty = np.full(pos.shape, np.nan, dtype=np.float32)
        return _View(step=None, positions=pos, z=empty, raw=empty, renormalised=False)
    raw_row = np.asarray(scores.raw[s], dtype=np.float32)  # (N,)
    over, left_out = scored_positions(attr, pos, subset, hide_sinks)
    if over is not None:
        finite = over[np.isfinite(raw_row[over])]  # NaN scores stay NaN instead of poisoning the mean
        z_row = zscore(raw_row[None, :], finite)[0]  # (N,), NaN outside `finite` (and so at the sinks left out)
    else:
        z_row = np.asarray(scores.z[s], dtype=np.float32)  # (N,)
    sinks = np.isin(pos, left_out) if left_out else None  # (n,)
    return _View(step=s, positions=pos, z=z_row[pos], raw=raw_row[pos], renormalised=subset, sinks=sinks)


def _auto_zmax(views: Sequence[_View]) -> float:
    vals = [np.abs(v.z[np.isfinite(v.z)]) for v in views]
    vals = [v for v in vals if v.size]
    if not vals:
        return 1.0
    # z-scores of a non-constant row always reach |z| >= 1, so the floor only matters for all-equal rows
    return float(np.clip(max(float(v.max()) for v in vals), 1.0, Z_CLIP))


def _quoted(token: str) -> str:
    return "'" + visible_whitespace(token) + "'"


def _token_text_html(token: str) -> str:
    if token == "":
        return '<span class="xe">∅</span>'
    text = html.escape(token.replace("\r", ""), quote=False)
    return text.replace("\n", "⏎<br>")


def _ranges(positions: list[int]) -> str:
    """Ascending positions as ranges: [3, 4, 5, 9] -> "3-5,9"."""
    out, i = [], 0
    while i < len(positions):
        j = i
        while j + 1 < len(positions) and positions[j + 1] == positions[j] + 1:
            j += 1
        out.append(str(positions[i]) if i == j else f"{positions[i]}-{positions[j]}")
        i = j + 1
    return ",".join(out)


def _tokens_html(attr: Attribution, view: _View, zmax: float) -> str:
    # Bytes matter here (the panel is re-sent on every streamed update): a short tag, unquoted class and title.
    parts = []
    prev = None
    positions = view.positions.tolist()
    sinks = view.sinks.tolist() if view.sinks is not None else [False] * len(positions)
    for p, z, sink in zip(positions, view.z.tolist(), sinks, strict=True):
        if prev is not None and p != prev + 1:
            parts.append('<i class="xh" title="tokens hidden"> … </i>')
        prev = p
        text = _token_text_html(attr.prompt_tokens[p])
        if view.step is None:
            parts.append(f"<i>{text}</i>")
        elif sink:
            parts.append(f'<i class=xs title="{SINK_TITLE}">{text}</i>')
        elif not math.isfinite(z):
            parts.append(f'<i class=xg title="no score">{text}</i>')
        else:
            css = bin_class(z, zmax)
            parts.append(f"<i{' class=' + css if css else ''} title={z:+.2f}>{text}</i>")
    return f'<div class="xai-flow" data-pos="{_ranges(positions)}">{"".join(parts)}</div>'


def _legend_html(zmax: float, unit: str = "token", label: str = "z-score") -> str:
    """The colour legend; `unit` names what is coloured (token, word, sentence) and `label` its score."""
    stops = [diverging_color(-zmax * i / BINS, zmax) for i in range(BINS, 0, -1)]
    stops += [diverging_color(zmax * i / BINS, zmax) for i in range(BINS + 1)]
    gradient = ", ".join(stops)
    described = (
        f"Colour scale of the z-scores: blue at {-zmax:+.2f} (less important than average), white at 0, red at "
        f"{zmax:+.2f} (more important than average); strongly red {unit}s are also bold. Each {unit}'s {label} is "
        "its title, shown on hover."
    )
    return (
        f'<div class="xai-legend" data-zmax="{zmax:.6g}" role="group" aria-label="{html.escape(described)}" '
        f'style="display:flex;align-items:center;gap:10px;flex-wrap:wrap;font-size:12px;margin-top:8px;color:{_TEXT};">'
        f"<span>{label}</span>"
        '<div style="width:200px;" aria-hidden="true">'
        f'<div style="height:10px;border:1px solid #d0d7de;border-radius:2px;background:linear-gradient(to right, '
        f'{gradient});"></div>'
        '<div style="display:flex;justify-content:space-between;">'
        f"<span>{-zmax:+.2f}</span><span>0</span><span>{zmax:+.2f}</span></div></div>"
        f'<span style="color:{_MUTED};" aria-hidden="true">red, bold: more important than average · blue: less · '
        f"hover a {unit} for its {label}</span>"
        "</div>"
    )


def _note_html(text: str) -> str:
    return f'<div style="font-size:13px;color:{_MUTED};margin:4px 0;">{html.escape(text)}</div>'


def _step_caption(attr: Attribution, step: int | None, num_steps: int) -> str:
    if step is None:
        return "No generated tokens yet: scores appear as the answer streams."
    token = attr.generated_tokens[step] if step < len(attr.generated_tokens) else ""
    contrast = contrasted_steps(attr).get(step)
    if contrast is not None:
        return (
            f"Step {step + 1} of {num_steps} explains why {_quoted(token)} rather than {_quoted(contrast['foil'])} "
            "(contrastive: the logit difference)"
        )
    return f"Step {step + 1} of {num_steps} explains the token {_quoted(token)}"


def no_scores_label(attr: Attribution, method: str) -> str:
    """What a panel without scores for its step says: "no scores yet" before the first token, "pending" while the
    result is still being made (a post-hoc method runs after the answer), and "not in this result" for a method a
    finished or saved result does not hold (nothing is pending there)."""
    if attr.num_steps == 0:
        return "no scores yet"
    if method not in attr.methods and attr.meta.get("status") in (None, "done"):
        return "not in this result"
    return "pending"


NOT_CONTRASTIVE = "No contrastive map: this method's attention does not depend on the target token."


def _scope_caption(view: _View) -> str:
    left_out = 0 if view.sinks is None else int(view.sinks.sum())
    shown = view.positions.size - left_out
    if left_out:
        sinks = f"{left_out} attention sink{'s' if left_out > 1 else ''} left out (hatched)"
        where = "tokens of your text" if view.renormalised else "prompt tokens"
        return f"z-scores over the other {shown} {where}; {sinks}"
    if view.renormalised:
        return f"z-scores re-normalised over the {view.positions.size} tokens of your text"
    return f"z-scores over all {view.positions.size} prompt tokens"


def side_by_side_html(
    attr: Attribution,
    methods: Sequence[str],
    step: int | None = None,
    user_only: bool = True,
    zmax: float | None = None,
    hide_sinks: bool = False,
) -> str:
    """One heatmap panel per method for the same step, all on one shared colour scale.

    Args:
        attr: the generation and its scores, each method (K, N).
        methods: method names, one panel each (a method without scores gets a neutral panel saying why:
            `no_scores_label`).
        step: 0-based generated-token index; None is the newest, out-of-range values are clamped.
        user_only: show only `attr.user_positions` and re-standardise `raw` over them (falls back to all N tokens
            when there are none); False shows all N tokens with the stored `z`.
        zmax: shared half-width of the colour range; None uses the largest |z| over all panels, capped at `Z_CLIP`.
        hide_sinks: leave the result's attention sinks (`explainer.result.sinks.sink_positions`) out of each step's
            z-scores and the colour range; they are drawn hatched, with no score.

    Returns:
        An HTML fragment: a caption, a responsive grid of panels titled with method name and seconds, one legend.
    """
    methods = list(methods)
    if not methods:
        return f'<div class="xai-heatmap" style="{_CARD}">{_note_html("Select at least one attribution method.")}</div>'
    views = [_view(attr, m, step, user_only, hide_sinks) for m in methods]
    blank = [v.step is not None and is_blank(attr, m, v.step) for m, v in zip(methods, views)]  # see `contrast`
    scored = [v for v, b in zip(views, blank) if v.step is not None and not b]
    zmax = _auto_zmax(scored) if zmax is None or zmax <= 0 else float(zmax)
    header_step = clamp_step(step, attr.num_steps)  # None only before the first token
    caption = html.escape(_step_caption(attr, header_step, attr.num_steps))
    if scored:
        caption += f" · {html.escape(_scope_caption(scored[0]))}"
    panels = []
    for method, view, no_map in zip(methods, views, blank, strict=True):
        scores = attr.methods.get(method)
        if no_map:
            detail = "not contrastive"
        elif scores is not None and view.step is not None:
            detail = f"{scores.seconds:.2f} s"
        else:
            detail = no_scores_label(attr, method)
        panels.append(
            f'<div class="xai-panel" data-method="{html.escape(method, quote=True)}" '
            'style="border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;min-width:0;">'
            f'<div style="font-weight:600;font-size:14px;margin-bottom:4px;">{html.escape(method)} '
            f'<span style="font-weight:400;color:{_MUTED};">· {html.escape(detail)}</span></div>'
            f"{_note_html(NOT_CONTRASTIVE) if no_map else _tokens_html(attr, view, zmax)}</div>"
        )
    grid = "display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,300px),1fr));gap:10px;align-items:start;"
    legend = _legend_html(zmax) if scored else ""
    return (
        f'<div class="xai-heatmap" style="{_CARD}">{_STYLE}'
        f'<div style="font-size:13px;margin-bottom:8px;">{caption}</div>'
        f'<div style="{grid}">{"".join(panels)}</div>{legend}</div>'
    )


def _step_score(attr: Attribution, key: str, step: int) -> float:
    """`attr.step_scores[key][step]` as a float, NaN when the result has none (older results, wrong length)."""
    values = attr.step_scores.get(key) if isinstance(attr.step_scores, dict) else None
    if not isinstance(values, list | tuple) or len(values) != attr.num_steps:
        return math.nan
    v = values[step]
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _probability_text(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def answer_html(attr: Attribution, step: int | None = None, last: int | None = None) -> str:
    """The answer as text with the explained token (or span of tokens) outlined, and each token's step scores.

    Each token's hover title names its step and, when the result has step scores, the probability the model gave it
    and the entropy of that step (nats); a token with probability below `LOW_PROBABILITY` is underlined with dots
    (a cue that does not rely on colour), explained in a legend line under the answer. A given answer says so
    ("given answer (teacher-forced)").

    Args:
        attr: the generation; its K `generated_tokens` are shown, with `attr.step_scores` when present.
        step: 0-based index of the highlighted token; None is the newest, out-of-range values are clamped.
        last: with a span, its last step (inclusive, clamped): steps `step`..`last` are highlighted; None is `step`.

    Returns:
        An HTML fragment; highlighted tokens carry `data-selected`, underlined ones `data-low`.
    """
    num_steps = len(attr.generated_tokens)
    s = clamp_step(step, num_steps)
    if s is None:
        return f'<div class="xai-answer" style="{_CARD}">{_note_html("No answer yet.")}</div>'
    e = s if last is None else clamp_step(last, num_steps)
    first, e = min(s, e), max(s, e)
    scored = False
    parts = []
    for i, token in enumerate(attr.generated_tokens):
        title = f"step {i + 1}: {_quoted(token)}"
        p, h = _step_score(attr, "probability", i), _step_score(attr, "entropy", i)
        style, low = _TOKEN, ""
        if math.isfinite(p):
            scored = True
            title += f" · p = {_probability_text(p)}"
            if p < LOW_PROBABILITY:
                style, low = style + _LOW, ' data-low="true"'
        if math.isfinite(h):
            scored = True
            title += f" · entropy {h:.2f} nats"
        selected = ""
        if first <= i <= e:
            style, selected = style + (_SELECTED if first == e else _IN_SPAN), ' data-selected="true"'
        parts.append(
            f'<span class="xai-step" data-step="{i}"{selected}{low} style="{style}" '
            f'title="{html.escape(title, quote=True)}">{_token_text_html(token)}</span>'
        )
    head = _note_html("Given answer (teacher-forced)") if attr.meta.get("answer") == "given" else ""
    legend = ""
    if scored:
        legend = _note_html(
            "Hover a token for the probability p the model gave it and the entropy of that step (nats); "
            f"dotted underline: p < {LOW_PROBABILITY:g}."
        )
    return f'<div class="xai-answer" style="{_CARD}">{head}<div style="{_FLOW}">{"".join(parts)}</div>{legend}</div>'


def top_tokens_rows(
    attr: Attribution,
    method: str,
    step: int | None = None,
    k: int = 5,
    user_only: bool = True,
    hide_sinks: bool = False,
) -> list[list]:
    """The k prompt tokens with the highest z-score at one step, for a table.

    Args:
        attr: the generation and its scores, (K, N) per method.
        method: which method's scores to rank.
        step: 0-based generated-token index; None is the newest, out-of-range values are clamped.
        k: number of rows at most.
        user_only: rank only the user's tokens, with z re-standardised over them (as in `side_by_side_html`).
        hide_sinks: leave the attention sinks out of the z-scores and the ranking (as in `side_by_side_html`).

    Returns:
        Rows `[rank (1-based), token (visible whitespace), prompt position, z rounded to 3 decimals]`, best first;
        empty when the method has no scores for any step, or no map at a contrasted step. NaN scores are left out.
    """
    view = _view(attr, method, step, user_only, hide_sinks)
    if view.step is None or is_blank(attr, method, view.step):
        return []
    order = np.argsort(-np.nan_to_num(view.z, nan=-np.inf), kind="stable")  # ties keep prompt order
    order = [i for i in order.tolist() if math.isfinite(view.z[i])][: max(int(k), 0)]
    return [
        [
            rank,
            visible_whitespace(attr.prompt_tokens[view.positions[i]]),
            int(view.positions[i]),
            round(float(view.z[i]), 3),
        ]
        for rank, i in enumerate(order, start=1)
    ]
