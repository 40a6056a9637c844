"""The prompt heatmap at token, word or sentence granularity, for one answer step or a span of them, and the top
supporting sentences per method.

Pure functions over an `Attribution` (scores from `explainer.result.spans`). The HTML reuses the token heatmap's colour
bins, stylesheet and legend, so the views look and read alike: each unit is `<i class=r3 title=+1.23>text</i>`
(colour bin as class, score as hover title), its text stays selectable, and a panel's `data-pos` holds its prompt
positions as ranges. At word and sentence granularity `data-groups` lists each unit's positions (`3-4,5,6-9`), so
a click can be mapped back to tokens.

Scores: a unit's score is the mean z-score of its tokens (`explainer.result.spans.group_scores`); over a span of steps,
the token z-scores are first averaged over the steps (`explainer.result.spans.span_scores`). User text is shown with its
control characters and bidirectional overrides made visible (`␀`, `⟨U+202E⟩`), so a hostile prompt cannot hide
text or reorder the rest of the panel.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from explainer.errors import InputError
from explainer.result.attribution import Attribution
from explainer.result.sinks import scored_positions
from explainer.result.spans import (
    GRANULARITIES,
    Group,
    ScoredGroup,
    group_scores,
    groups,
    shown_positions,
    span_range,
    span_scores,
    top_sentences,
)
from visuals.heatmap import (
    _CARD,
    _MUTED,
    _STYLE,
    SINK_TITLE,
    Z_CLIP,
    _legend_html,
    _note_html,
    _ranges,
    bin_class,
    no_scores_label,
    visible_whitespace,
)

ZMIN_AUTO = 0.5  # smallest automatic colour range: means of z-scores are small, but near-zero ones stay pale
SPAN_TEXT = 60  # characters of the span's answer text quoted in the caption

_GRID = "display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,300px),1fr));gap:10px;align-items:start;"
_PANEL = "border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;min-width:0;"
_BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))  # embeddings, overrides (LRE..RLO), isolates (LRI..PDI)
# Control characters shown as their Unicode control pictures (U+2400 + code), DEL as ␡, C1 controls as U+FFFD;
# newlines and tabs are kept (the flow is pre-wrap) and carriage returns dropped, as in the token heatmap.
_VISIBLE = {c: chr(0x2400 + c) for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)}
_VISIBLE |= {0x0D: None, 0x7F: "␡"} | {c: "\ufffd" for c in range(0x80, 0xA0)}
_VISIBLE |= {c: f"⟨U+{c:04X}⟩" for c in _BIDI}
_UNIT_NAMES = {"token": "tokens", "word": "words", "sentence": "sentences"}


def safe_text(text: str) -> str:
    """`text` with control characters and bidirectional embeddings/overrides/isolates made visible (see module
    docstring); everything else, right-to-left letters and emoji included, unchanged. Not yet HTML-escaped."""
    return text.translate(_VISIBLE)


def _text_html(text: str) -> str:
    if text == "":
        return '<span class="xe">∅</span>'
    return html.escape(safe_text(text), quote=False).replace("\n", "⏎<br>")


def _span_caption(attr: Attribution, first: int, last: int, num_steps: int) -> str:
    if first == last:
        token = attr.generated_tokens[first] if first < len(attr.generated_tokens) else ""
        return f"Step {first + 1} of {num_steps} explains the token '{visible_whitespace(safe_text(token))}'"
    text = "".join(attr.generated_tokens[first : last + 1])
    text = visible_whitespace(safe_text(text), spaces=False)
    if len(text) > SPAN_TEXT:
        text = text[: SPAN_TEXT - 1] + "…"
    return f"Steps {first + 1}-{last + 1} of {num_steps} explain '{text}' · mean of the per-step z-scores"


def _scope_caption(n: int, subset: bool) -> str:
    if subset:
        return f"z-scores re-normalised over the {n} tokens of your text"
    return f"z-scores over all {n} prompt tokens"


def _granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise InputError(f"Unknown granularity {granularity!r}; choose one of: {', '.join(GRANULARITIES)}.")
    return granularity


def _units_html(
    units: Sequence[Group], scores: np.ndarray | None, zmax: float, grouped: bool, sinks: Sequence[int] = ()
) -> str:
    # Bytes matter as in the token heatmap: a short tag, unquoted class and title. A unit of sinks only is hatched.
    parts, positions, spans = [], [], []
    sinks = set(sinks)
    prev = None
    for i, g in enumerate(units):
        if prev is not None and g.start != prev:
            parts.append('<i class="xh" title="tokens hidden"> … </i>')
        prev = g.stop
        positions.extend(g.positions)
        spans.append(str(g.start) if len(g) == 1 else f"{g.start}-{g.stop - 1}")
        text = _text_html(g.text)
        if scores is None:
            parts.append(f"<i>{text}</i>")
        elif sinks and set(g.positions) <= sinks:
            parts.append(f'<i class=xs title="{SINK_TITLE}">{text}</i>')
        elif not math.isfinite(scores[i]):
            parts.append(f'<i class=xg title="no score">{text}</i>')
        else:
            css = bin_class(float(scores[i]), zmax)
            parts.append(f"<i{' class=' + css if css else ''} title={scores[i]:+.2f}>{text}</i>")
    groups_attr = f' data-groups="{",".join(spans)}"' if grouped else ""
    return f'<div class="xai-flow" data-pos="{_ranges(positions)}"{groups_attr}>{"".join(parts)}</div>'


def span_side_by_side_html(
    attr: Attribution,
    methods: Sequence[str],
    first: int | None = None,
    last: int | None = None,
    granularity: str = "token",
    user_only: bool = True,
    zmax: float | None = None,
    hide_sinks: bool = False,
) -> str:
    """One heatmap panel per method over the prompt, at token, word or sentence granularity, for one answer step
    or the mean over a span of steps, all on one shared colour scale.

    Args:
        attr: the generation and its scores, each method (K, N).
        methods: method names, one panel each; a method with no scores up to `last` gets a neutral panel saying why
            (`no_scores_label`).
        first: first answer step, 0-based; None is the newest.
        last: last answer step, inclusive; None means `first` (one step, as in the token heatmap).
        granularity: "token", "word" or "sentence" (see `explainer.result.spans.word_groups` / `sentence_groups`).
        user_only: show only the user's text with z re-standardised over it per step (as the token heatmap does);
            False shows all N tokens with the stored z-scores.
        zmax: shared half-width of the colour range; None uses the largest |score| shown, within
            [`ZMIN_AUTO`, `Z_CLIP`].
        hide_sinks: leave the attention sinks out of each step's z-scores (units of sinks only are hatched).

    Returns:
        An HTML fragment: a caption saying what is shown (steps, aggregation, granularity, scope), a grid of panels
        titled with method name and seconds, one legend.

    Raises:
        InputError: an unknown granularity, or a span outside the answer (see `explainer.result.spans.span_range`).
    """
    granularity = _granularity(granularity)
    methods = list(methods)
    if not methods:
        return f'<div class="xai-heatmap" style="{_CARD}">{_note_html("Select at least one attribution method.")}</div>'
    units = groups(attr, granularity, user_only)
    pos, subset = shown_positions(attr, user_only)
    over, left_out = scored_positions(attr, pos, subset, hide_sinks)
    first, last, caption = _span_and_caption(attr, first, last, granularity, pos.size, subset, len(left_out))
    per_method = [_unit_scores(attr, m, first, last, units, over) for m in methods]
    scored = [s for s in per_method if s is not None]
    if zmax is None or zmax <= 0:
        finite = [np.abs(s[np.isfinite(s)]) for s in scored]
        zmax = float(np.clip(max((float(f.max()) for f in finite if f.size), default=1.0), ZMIN_AUTO, Z_CLIP))
    zmax = float(zmax)
    panels = []
    for m, scores in zip(methods, per_method, strict=True):
        detail = f"{attr.methods[m].seconds:.2f} s" if scores is not None else no_scores_label(attr, m)
        panels.append(_panel(m, detail, _units_html(units, scores, zmax, granularity != "token", left_out)))
    label = "z-score" if granularity == "token" and first == last else "mean z-score"
    legend = _legend_html(zmax, granularity, label) if scored else ""
    return (
        f'<div class="xai-heatmap" data-granularity="{granularity}" style="{_CARD}">{_STYLE}'
        f'<div style="font-size:13px;margin-bottom:8px;">{html.escape(caption)}</div>'
        f'<div style="{_GRID}">{"".join(panels)}</div>{legend}</div>'
    )


def _span_and_caption(
    attr: Attribution, first: int | None, last: int | None, granularity: str, shown: int, subset: bool, sinks: int = 0
) -> tuple[int | None, int | None, str]:
    """The span of steps shown (None, None before the first token) and the caption saying what is shown (and how
    many attention `sinks` are left out)."""
    if attr.num_steps == 0:
        return None, None, "No generated tokens yet: scores appear as the answer streams."
    first, last = span_range(attr.num_steps, first, last)
    caption = _span_caption(attr, first, last, attr.num_steps) + f" · {_UNIT_NAMES[granularity]}"
    if granularity != "token":
        caption += " (mean z-score of their tokens)"
    caption += f" · {_scope_caption(shown, subset)}"
    if sinks:
        caption += f" · {sinks} attention sink{'s' if sinks > 1 else ''} left out (hatched)"
    return first, last, caption


def _unit_scores(
    attr: Attribution, method: str, first: int | None, last: int | None, units: list[Group], positions: Any
) -> np.ndarray | None:
    """(G,) each unit's mean z over the span, z re-standardised over `positions` when given; None without scores."""
    s = attr.methods.get(method)
    if first is None or s is None or s.raw.shape[0] <= last:
        return None
    return group_scores(span_scores(attr, method, first, last, positions), units)


def _panel(method: str, detail: str | None, body: str) -> str:
    """One method's panel: its name (and a detail such as its seconds) over `body`."""
    title = html.escape(safe_text(method))
    if detail is not None:
        title += f' <span style="font-weight:400;color:{_MUTED};">· {html.escape(detail)}</span>'
    return (
        f'<div class="xai-panel" data-method="{html.escape(method, quote=True)}" style="{_PANEL}">'
        f'<div style="font-weight:600;font-size:14px;margin-bottom:4px;">{title}</div>{body}</div>'
    )


_CELL = "padding:2px 6px;vertical-align:top;text-align:left;"


def _top_table(method: str, top: list[ScoredGroup] | None, zmax: float, missing: str) -> str:
    """A method's top sentences as a table: rank, a score badge coloured like the heatmap, the sentence; `missing`
    says why a method without scores has none (`no_scores_label`)."""
    if top is None:
        body = f'<tr><td colspan="3" style="{_CELL}color:{_MUTED};">{html.escape(missing)}</td></tr>'
    elif not top:
        body = f'<tr><td colspan="3" style="{_CELL}color:{_MUTED};">no sentence with a score</td></tr>'
    else:
        rows = []
        for t in top:
            css = bin_class(t.score, zmax)
            badge = f"<i{' class=' + css if css else ''}>{t.score:+.2f}</i>"
            rows.append(
                f'<tr data-pos="{t.group.start}-{t.group.stop - 1}"><td style="{_CELL}">{t.rank}</td>'
                f'<td style="{_CELL}">{badge}</td><td style="{_CELL}">{_text_html(t.text.strip())}</td></tr>'
            )
        body = "".join(rows)
    head = "".join(f'<th scope="col" style="{_CELL}">{h}</th>' for h in ("#", "mean z", "sentence"))
    return (
        f'<div class="xai-flow"><table style="border-collapse:collapse;width:100%;">'
        f'<caption style="position:absolute;left:-9999px;">Top sentences for {html.escape(safe_text(method))}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _top(
    attr: Attribution, method: str, first: int, last: int, k: int, user_only: bool, hide_sinks: bool
) -> list[ScoredGroup] | None:
    s = attr.methods.get(method)
    if s is None or s.raw.shape[0] <= last:
        return None
    return top_sentences(attr, method, first, last, k, user_only, hide_sinks)


def top_sentences_html(
    attr: Attribution,
    methods: Sequence[str],
    first: int | None = None,
    last: int | None = None,
    k: int = 3,
    user_only: bool = True,
    zmax: float | None = None,
    hide_sinks: bool = False,
) -> str:
    """The top supporting sentences of each method side by side: one table per method, best first.

    Args:
        attr: the generation and its scores, (K, N) per method.
        methods: method names, one table each (a method with no scores up to `last` says why: `no_scores_label`).
        first: first answer step, 0-based; None is the newest.
        last: last answer step, inclusive; None means `first`.
        k: rows per method at most.
        user_only: only the user's text, z re-standardised over it per step (as in the token heatmap).
        zmax: half-width of the colour range of the score badges; None uses the largest |score| listed, within
            [`ZMIN_AUTO`, `Z_CLIP`] (pass the heatmap's to match its colours).
        hide_sinks: leave the attention sinks out of each step's z-scores (`explainer.result.spans.top_sentences`).

    Returns:
        An HTML fragment: a caption, then per method a table with rank, score (a badge coloured like the heatmap,
        with its number written out) and the sentence (its prompt positions in the row's `data-pos`).

    Raises:
        InputError: a span outside the answer (see `explainer.result.spans.span_range`).
    """
    methods = list(methods)
    if not methods:
        return f'<div class="xai-top" style="{_CARD}">{_note_html("Select at least one attribution method.")}</div>'
    if attr.num_steps == 0:
        return f'<div class="xai-top" style="{_CARD}">{_note_html("No answer yet: nothing to rank.")}</div>'
    first, last = span_range(attr.num_steps, first, last)
    tops = [_top(attr, m, first, last, k, user_only, hide_sinks) for m in methods]
    if zmax is None or zmax <= 0:
        peak = max((abs(t.score) for top in tops if top for t in top), default=1.0)
        zmax = float(np.clip(peak, ZMIN_AUTO, Z_CLIP))
    _, subset = shown_positions(attr, user_only)
    scope = "your text" if subset else "the whole prompt"
    caption = (
        f"Top sentences of {scope} · {_span_caption(attr, first, last, attr.num_steps)} · mean z-score of their tokens"
    )
    tables = [_top_table(m, top, zmax, no_scores_label(attr, m)) for m, top in zip(methods, tops, strict=True)]
    panels = [_panel(m, None, table) for m, table in zip(methods, tables)]
    return (
        f'<div class="xai-top" style="{_CARD}">{_STYLE}'
        f'<div style="font-size:13px;margin-bottom:8px;">{html.escape(caption)}</div>'
        f'<div style="{_GRID}">{"".join(panels)}</div></div>'
    )
