"""Pure views of faithfulness reports: MIF / LIF removal curves, pi-Soft curves and a summary table.

They read the plain-data reports of `explainer.faithfulness` (lists and dicts only) and never touch a model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explainer.faithfulness.metrics import REMOVAL_METRICS

if TYPE_CHECKING:  # the reports are plain data; importing them at run time would pull in torch
    from explainer.faithfulness import FaithfulnessReport, RemovalReport, SoftReport

RANDOM = "random"
PALETTE = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
RANDOM_COLOR = "#7f7f7f"
METRIC_LABELS = {m.key: m.description for m in REMOVAL_METRICS}
TABLE_HEADERS = [
    "method",
    *(f"SRG {m.label.replace('mean ', '')} {'↓' if m.lower_is_better else '↑'}" for m in REMOVAL_METRICS),
    "AUC π-Soft-NS ↑",
    "AUC π-Soft-NC ↑",
]


def method_colors(methods: list[str], reference: str = RANDOM, reference_color: str = RANDOM_COLOR) -> dict[str, str]:
    """One colour per method, stable in the given order; the reference line (the random baseline) is grey."""
    others = [m for m in methods if m != reference]
    colors = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(others)}
    if reference in methods:
        colors[reference] = reference_color
    return colors


def _line(method: str, color: str) -> dict:
    return {"color": color, "width": 2, "dash": "dash" if method == RANDOM else "solid"}


def removal_figure(report: RemovalReport, metric: str = "logit") -> go.Figure:
    """MIF (left) and LIF (right) curves of one metric: normalised value vs percentage of tokens removed."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("most influential first (MIF)", "least influential first (LIF)")
    )
    methods = list(report.curves)
    colors = method_colors(methods)
    x = [100 * f for f in report.fractions]
    for m in methods:
        curves = report.curves[m].get(metric)
        if curves is None:
            continue
        srg = report.auc[m][metric]["srg"]
        for col, name in ((1, "mif"), (2, "lif")):
            fig.add_trace(
                go.Scatter(
                    x=x, y=curves[name], mode="lines+markers", name=f"{m} (SRG {srg:+.3f})", legendgroup=m,
                    showlegend=col == 1, line=_line(m, colors[m]),
                    hovertemplate=f"{m}<br>%{{x:.0f}}% removed: %{{y:.3f}}<extra></extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
    fig.update_xaxes(title_text="tokens removed (%)")
    fig.update_yaxes(title_text=f"{METRIC_LABELS.get(metric, metric)} / unperturbed", row=1, col=1)
    fig.update_layout(height=360, margin={"l": 60, "r": 20, "t": 40, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


def soft_figure(report: SoftReport) -> go.Figure:
    """pi-Soft-NS (left) and pi-Soft-NC (right) vs the target retaining probability pi."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("π-Soft-NS (sufficiency) ↑", "π-Soft-NC (comprehensiveness) ↑"))
    methods = list(report.ns)
    colors = method_colors(methods)
    for m in methods:
        for col, curve, auc in ((1, report.ns[m], report.auc_ns[m]), (2, report.nc[m], report.auc_nc[m])):
            fig.add_trace(
                go.Scatter(
                    x=report.pis, y=curve, mode="lines+markers", name=f"{m} (AUC NS {report.auc_ns[m]:.3f})",
                    legendgroup=m, showlegend=col == 1, line=_line(m, colors[m]),
                    hovertemplate=f"{m}<br>π=%{{x:.2f}}: %{{y:.3f}} (AUC {auc:.3f})<extra></extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
    fig.update_xaxes(title_text="retaining probability π")
    fig.update_layout(height=360, margin={"l": 60, "r": 20, "t": 40, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def faithfulness_rows(report: FaithfulnessReport) -> list[list]:
    """Summary rows, one per method, in the order of `TABLE_HEADERS` (None where a part was not computed)."""
    removal, soft = report.removal, report.soft
    methods = list(dict.fromkeys([*(removal.auc if removal else {}), *(soft.ns if soft else {})]))
    rows = []
    for m in methods:
        srg = [_num(removal.auc[m][k]["srg"]) if removal and m in removal.auc else None for k in METRIC_LABELS]
        ns = _num(soft.auc_ns.get(m)) if soft else None
        nc = _num(soft.auc_nc.get(m)) if soft else None
        rows.append([m, *srg, ns, nc])
    return rows
