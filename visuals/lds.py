"""Pure view of one answer's LDS per method (`explainer.faithfulness.lds.LdsReport`): a small horizontal bar chart
(narrow enough to sit beside the removal curves), Sources' own fit drawn apart (hatched) because it is
cross-validated on the masks it was fitted on, and a caption."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from .curves import method_colors
from .sources import spearman_text, whole_number

if TYPE_CHECKING:  # plain data; importing it at run time would pull in torch
    from explainer.faithfulness.lds import LdsReport

SOURCES = "sources"
LABEL_ROOM = 0.45  # x-axis units past -1 and 1 that hold a bar's value written outside it
NO_SURROGATE = (
    "LDS on this answer needs Sources' ablations: tick *sources* (fit: surrogate, the default), explain, then measure."
)


def lds_figure(report: LdsReport) -> go.Figure:
    """One bar per method, top to bottom: its LDS on this answer (Spearman over the masks, -1 to 1), the mask count
    in the hover; a method without a value (constant scores) is listed with an empty bar marked n/a."""
    names = list(report.lds)
    colors = method_colors(names)
    fig = go.Figure()
    for name in names:
        value = report.lds[name]
        own = name == SOURCES
        label = f"{name} (own fit)" if own else name
        fig.add_trace(
            go.Bar(
                y=[label], x=[value if value is not None else 0.0], name=label, orientation="h",
                marker_color=colors[name], marker_pattern_shape="/" if own else "", showlegend=False,
                text=["n/a" if value is None else f"{value:+.2f}"], textposition="outside", cliponaxis=False,
                hovertemplate=f"{html.escape(label)}: %{{x:.3f}} over {report.masks.get(name, 0)} masks<extra></extra>",
            )
        )  # fmt: skip
    fig.update_xaxes(  # room beyond +-1 for a bar's label: "+0.93" at the end of a bar near 1 was cut off
        range=[-1 - LABEL_ROOM, 1 + LABEL_ROOM], tickvals=[-1, 0, 1], title_text="LDS (Spearman) ↑",
        zeroline=True, zerolinecolor="#888",
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed")  # the first method on top
    fig.update_layout(height=90 + 36 * max(1, len(names)), margin={"l": 10, "r": 30, "t": 10, "b": 40}, bargap=0.3)
    return fig


def lds_caption(report: LdsReport | None) -> str:
    """Markdown: how the bars were measured, and the surrogate's held-out fit; the reason when there are none."""
    if report is None:
        return NO_SURROGATE
    fit = report.fit
    held = fit.get("held_out_spearman")
    cv = fit.get("cross_validated_spearman")
    masks = max(report.masks.values(), default=0)
    checks = whole_number(fit.get("checks"))
    extra = f", held out on {checks} more masks {spearman_text(held)}" if checks else ""
    return (
        f"**LDS on this answer**: each method's unit scores predict the answer's log-probability on the full prompt "
        f"and Sources' {max(masks - 1, 0)} ablations over {report.units} units; Spearman of prediction and "
        f"measurement. Sources' fit "
        f"({_count(fit.get('ablations'))} ablations): cross-validated {spearman_text(cv)} (each mask predicted by a "
        f"fit without it){extra}. Few masks make these coarse."
    )


def _count(value: object) -> str:
    number = whole_number(value)
    return "n/a" if number is None else str(number)
