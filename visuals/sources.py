"""Sources, drawn: the passages of the prompt that support the answer, ranked, each linking to its place in the text.

Reads what the Sources method (`explainer/methods/sources.py`) keeps: its meta's `sources` (the top units with their
token spans and score over the answer) and its (K, N) scores. With the surrogate (meta `fit` "surrogate") a unit's
score is its fitted weight, the change of the answer's log-probability, in nats, that keeping it predicts (summed
over the answer's tokens), and its tokens share each step's weight evenly, so a step's unit score is their sum;
with leave-one-out, the loss increase when the unit is hidden, and every token of a unit carries the unit's score.
The list gives each unit's score over the whole answer and at the step on the slider (a sparse fit's units at 0 left
out); a click scrolls to the unit in the prompt text beneath, where every listed unit is tinted by its score at that
step.

Pure: an `Attribution` in, HTML out; no model.
"""

from __future__ import annotations

import html

import numpy as np

from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step

NO_SOURCES = (
    "<p>Tick <b>sources</b> among the methods and generate: it removes passages of your text in a few combinations, "
    "measures how likely the answer stays, and fits each passage's weight.</p>"
)


SCOPE_NOTES = {
    "answer": "Each passage was hidden from the answer's own reading (the positions that write it); the rest of the "
    "prompt still read it. Method options: scope = all removes it from the context instead (slower).",
    "all": "Each passage was removed from the context: hidden from every later token, the answer's included.",
}


def _tint(score: float, top: float) -> str:
    """Green for support (hiding the unit makes the answer less likely), red for the opposite, by magnitude."""
    a = 0.0 if top <= 0 else min(1.0, abs(score) / top) * 0.55
    return f"rgba(26,150,65,{a:.2f})" if score >= 0 else f"rgba(215,48,39,{a:.2f})"


def sources_html(attr: Attribution | None, step: int | None = None, method: str = "sources") -> str:
    """The ranked sources of `attr` and its prompt text with them marked; a note when Sources did not run.

    Args:
        attr: the result.
        step: 0-based answer step for the per-step column and the tints (None: the newest).
        method: the method whose meta lists the sources.
    """
    scores = attr.methods.get(method) if isinstance(attr, Attribution) else None
    if scores is None or not scores.meta.get("sources") or scores.raw.shape[0] == 0:
        return NO_SOURCES
    k = clamp_step(step, scores.raw.shape[0])
    raw = np.asarray(scores.raw, dtype=np.float64)  # (K, N)
    listed = scores.meta["sources"]
    surrogate = scores.meta.get("fit") == "surrogate"
    if surrogate and scores.meta.get("regulariser") == "lasso":  # a sparse fit: the passages it left at 0 say nothing
        listed = [s for s in listed if s["score"] != 0.0] or listed[:1]
    at_step = {s["start"]: float(raw[k, s["start"] : s["stop"]].sum() if surrogate else raw[k, s["start"]])
               for s in listed}  # fmt: skip
    top = max([abs(s["score"]) for s in listed] + [abs(v) for v in at_step.values()])
    token = html.escape(repr(attr.generated_tokens[k]) if k < len(attr.generated_tokens) else "")
    rows = [
        f"<tr><td>{i + 1}</td><td>{s['score']:+.3f}</td><td>{at_step[s['start']]:+.3f}</td>"
        f'<td><a href="#xai-src-{s["start"]}">{html.escape(s["text"][:160])}</a></td></tr>'
        for i, s in enumerate(listed)
    ]
    table = (
        '<table class="xai-sources"><thead><tr><th>#</th><th>answer</th>'
        f"<th>step {k + 1} {token}</th><th>passage (click: show it in the text)</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    note = _surrogate_note(scores.meta) if surrogate else SCOPE_NOTES.get(scores.meta.get("scope", "all"), "")
    return table + f'<p class="xai-sources-note">{html.escape(note)}</p>' + _text(attr, at_step, listed, top)


SPARSE_NOTE = (
    "the fit is sparse (ContextCite's Lasso): it finds the few passages the answer rests on and leaves the others at "
    "0, though they may matter a little."
)


def spearman_text(value: float | None) -> str:
    """A Spearman for a note or caption; "n/a" for anything but a number (a saved result may hold anything)."""
    return f"{value:+.2f}" if isinstance(value, int | float) and not isinstance(value, bool) else "n/a"


def whole_number(value: object) -> int | None:
    """An int from a method's meta or a saved result; None for anything else (a bool, a float, a string)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _fit_quality(meta: dict) -> str:
    """How well the fit predicts the answer on combinations it was not fitted on: cross-validated over its own (each
    predicted by a fit without it), and on the `check` extra ones where there were any."""
    checks, cv = whole_number(meta.get("checks")), meta.get("cross_validated_spearman")
    parts = [f"cross-validated over its combinations, Spearman {spearman_text(cv)}"] if cv is not None else []
    if checks:
        parts.append(f"on {checks} more combinations, Spearman {spearman_text(meta.get('held_out_spearman'))}")
    return f"Fit checked {' and '.join(parts)}." if parts else ""


SATURATING_FIT = (
    "one fit per answer token in which passages that say the same thing share their effect, read as each passage's "
    "weight in the straight line closest to it"
)


def _surrogate_note(meta: dict) -> str:
    units, ablations = meta.get("units_scored"), meta.get("ablations")
    design = f" ({meta['design']} design)" if meta.get("design") else ""
    fit = SATURATING_FIT if meta.get("regulariser") == "saturating" else "one linear fit per answer token"
    note = (
        f"Fitted as ContextCite does: {ablations} combinations of passages removed{design}, the answer's "
        f"log-probability under each, {fit} (a weight > 0: keeping the passage makes the answer more likely). "
        f"{_fit_quality(meta)}"
    )
    if isinstance(units, int) and isinstance(ablations, int) and units > ablations:
        sparse = meta.get("regulariser") == "lasso"
        note += (
            f" The text has {units} passages, more than the combinations: "
            + (SPARSE_NOTE if sparse else "most passages' weights are barely estimated.")
            + " For every passage's weight, raise ablations to twice the passages (at most 256), or choose "
            "fit=leave_one_out."
        )
    return note


def _text(attr: Attribution, row: dict[int, float], listed: list[dict], top: float) -> str:
    """The user's text with every listed unit marked (an anchor the list links to) and tinted by its score at the
    step (`row`: unit start -> score)."""
    starts = {s["start"]: s["stop"] for s in listed}
    positions = attr.user_positions or list(range(attr.num_prompt_tokens))
    lo, hi = min(positions), max(positions) + 1
    parts, p = [], lo
    while p < hi:
        if p in starts:
            stop = starts[p]
            text = html.escape("".join(attr.prompt_tokens[p:stop]))
            parts.append(
                f'<mark id="xai-src-{p}" style="background:{_tint(row[p], top)}" '
                f'title="{row[p]:+.3f} nats at this step">{text}</mark>'
            )
            p = stop
        else:
            parts.append(html.escape(attr.prompt_tokens[p]))
            p += 1
    style = "white-space:pre-wrap;max-height:320px;overflow:auto"
    return f'<div class="xai-sources-text" style="{style}">{"".join(parts)}</div>'
