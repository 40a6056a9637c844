"""Pure view of one answer's LDS per method (`explainer.faithfulness.lds.LdsReport`): a small bar chart, Sources'
own fit drawn apart (hatched) because it is cross-validated on the masks it was fitted on, and a one-line caption."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from .curves import method_colors

if TYPE_CHECKING:  # plain data; importing it at run time would pull in torch
    from explainer.faithfulness.lds import LdsReport

SOURCES = "sources"
NO_SURROGATE = (
    "LDS on this answer needs Sources' ablations: tick *sources* (fit: surrogate, the default), explain, then measure."
)


def lds_figure(report: LdsReport) -> go.Figure:
    """One bar per method: its LDS on this answer (Spearman over the masks, -1 to 1), the mask count in the hover;
    a method without a value (constant scores) is listed with an empty bar."""
    names = list(report.lds)
    colors = method_colors(names)
    fig = go.Figure()
    for name in names:
        value = report.lds[name]
        own = name == SOURCES
        label = f"{name} (own fit, cross-validated)" if own else name
        fig.add_trace(
            go.Bar(
                x=[label], y=[value if value is not None else 0.0], name=label, marker_color=colors[name],
                marker_pattern_shape="/" if own else "", showlegend=False,
                text=["n/a" if value is None else f"{value:+.2f}"], textposition="outside",
                hovertemplate=f"{html.escape(label)}: %{{y:.3f}} over {report.masks.get(name, 0)} masks<extra></extra>",
            )
        )  # fmt: skip
    fig.update_yaxes(range=[-1.05, 1.15], title_text="LDS (Spearman)", zeroline=True)
    fig.update_layout(height=300, margin={"l": 60, "r": 20, "t": 30, "b": 60}, title_text="LDS on this answer ↑",
                      title_font_size=13, bargap=0.4)  # fmt: skip
    return fig


def lds_caption(report: LdsReport | None) -> str:
    """Markdown: how the bars were measured, and the surrogate's held-out fit; the reason when there are none."""
    if report is None:
        return NO_SURROGATE
    fit = report.fit
    held = fit.get("held_out_spearman")
    cv = fit.get("cross_validated_spearman")
    masks = max(report.masks.values(), default=0)
    return (
        f"**LDS on this answer**: each method's unit scores predict the answer's log-probability under Sources' "
        f"{masks} ablation masks over {report.units} units; Spearman of prediction and measurement. Sources' fit "
        f"({fit.get('ablations')} ablations): cross-validated {_fmt(cv)}, held out on {fit.get('checks')} more masks "
        f"{_fmt(held)}. Few masks make these coarse."
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"
