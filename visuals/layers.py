"""MACS by layer: for one answer step, the L x N matrix of per-layer factors over the prompt, and their product.

MACS multiplies, over the layers, each layer's floored max-over-heads attention to a prompt token (MACS paper, Eq. 6:
f_l = alpha * max_h a_l + (1 - alpha), in [1 - alpha, 1]) into that token's score c_L (Eq. 7), which is z-scored for
the heatmap (Eq. 8). This view shows the factors of the step on the slider as a heatmap, layers down and prompt tokens
across, with the product row beneath on its own colour scale: a token whose score is low was cut by the layers where
its factor is dark. The factors are those MACS kept with `keep_layers` (`MethodScores.layers`).

Pure: an `Attribution` in, a Plotly figure out; no model.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explainer.result.attribution import Attribution
from explainer.result.spans import shown_positions
from explainer.result.steps import clamp_step
from visuals.heatmap import visible_whitespace

MAX_TICKS = 60  # token labels on the axis; every token keeps its hover
FACTOR_COLORS = "Viridis"  # dark: the layer cut the token's score
PRODUCT_COLORS = "Cividis"
# The page lets Plotly grow the margins to fit the rotated token labels and the colour bars; below about 400 px a
# model of a few layers left its plot a negative height and Plotly drew nothing (0 px, "axis scaling" error).
MIN_HEIGHT = 420


def has_layers(attr: Attribution | None, method: str = "macs") -> bool:
    """Whether `attr` holds per-layer scores of `method` with at least one step."""
    scores = attr.methods.get(method) if isinstance(attr, Attribution) else None
    return scores is not None and scores.layers is not None and scores.layers.shape[0] > 0


def layer_positions(attr: Attribution, show_all: bool = False) -> np.ndarray:
    """The prompt positions the view shows: every one with `show_all`, else the user's text and the image's tokens
    (the chat template's tokens left out, as the token heatmap does), ascending."""
    if show_all:
        return np.arange(attr.num_prompt_tokens, dtype=np.int64)
    positions, user_only = shown_positions(attr, True)
    if not user_only:  # no user positions: all of them already
        return positions
    image = attr.image_token_positions
    return np.union1d(positions, np.asarray(image, dtype=np.int64))


def _label(token: str) -> str:
    return html.escape(visible_whitespace(token, spaces=False), quote=False)  # Plotly renders tags in labels


def _ticks(labels: list[str]) -> tuple[list[int], list[str]]:
    """At most `MAX_TICKS` evenly spread tick positions and their labels."""
    every = max(1, -(-len(labels) // MAX_TICKS))
    ticks = list(range(0, len(labels), every))
    return ticks, [labels[i] for i in ticks]


def layer_figure(
    attr: Attribution, step: int | None = None, positions: Sequence[int] | None = None, method: str = "macs"
) -> go.Figure:
    """Per-layer factors of one answer step (L rows) over the prompt, and their product (a row beneath).

    Args:
        attr: a result whose `method` kept per-layer scores (`has_layers`).
        step: 0-based answer step; None is the newest; clamped (`steps.clamp_step`).
        positions: prompt positions to show, in order (default: all N).
        method: the method whose layers are shown.

    Returns:
        Two heatmaps sharing the token axis: the (L, n) factors (layer 1 on top) and the (1, n) product over the
        layers; each cell's hover names the layer, the token, its prompt position and the value.

    Raises:
        ValueError: the method kept no per-layer scores.
    """
    if not has_layers(attr, method):
        raise ValueError(f"{method} kept no per-layer scores in this result (MACS option keep_layers).")
    scores = attr.methods[method]
    k = clamp_step(step, scores.layers.shape[0])
    cols = np.arange(attr.num_prompt_tokens) if positions is None else np.asarray(positions, dtype=np.int64)
    factors = scores.layers[k][:, cols].astype(np.float64)  # (L, n)
    product = np.prod(factors, axis=0)  # (n,), Eq. 7
    layers, x = factors.shape[0], np.arange(cols.size)
    labels = [_label(attr.prompt_tokens[p]) for p in cols]
    hover = [[f"{t} (position {p})" for t, p in zip(labels, cols)]]  # (1, n), repeated per row below
    alpha, pooling = scores.meta.get("alpha"), scores.meta.get("pooling", "max")
    known = isinstance(alpha, int | float) and 0 <= alpha <= 1
    low = 1.0 - float(alpha) if known else float(np.nanmin(factors, initial=1.0))  # the floor of Eq. 6
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.85, 0.15], vertical_spacing=0.04)
    fig.add_trace(
        go.Heatmap(
            z=factors, x=x, y=np.arange(1, layers + 1), text=hover * layers, colorscale=FACTOR_COLORS,
            zmin=low, zmax=1.0, colorbar={"title": "factor", "y": 0.6, "len": 0.8},
            hovertemplate="layer %{y}<br>token %{text}<br>factor %{z:.4f}<extra></extra>",
        ),
        row=1, col=1,
    )  # fmt: skip
    fig.add_trace(
        go.Heatmap(
            z=product[None], x=x, y=["product"], text=hover, colorscale=PRODUCT_COLORS,
            colorbar={"title": "product", "y": 0, "yanchor": "bottom", "len": 0.2, "tickformat": ".1e"},  # decades
            hovertemplate="product over layers<br>token %{text}<br>c = %{z:.4g}<extra></extra>",
        ),
        row=2, col=1,
    )  # fmt: skip
    ticks, ticktext = _ticks(labels)
    fig.update_xaxes(tickvals=ticks, ticktext=ticktext, tickangle=-60, row=2, col=1)
    fig.update_yaxes(autorange="reversed", title_text="layer", tick0=1, dtick=max(1, layers // 12), row=1, col=1)
    token = _label(attr.generated_tokens[k]) if k < len(attr.generated_tokens) else ""
    name = "MACS" if method == "macs" else _label(method)
    fig.update_layout(
        title=f"{name} by layer, step {k + 1} ('{token}'): factor = α·{_label(str(pooling))} over heads + (1−α)",
        height=max(MIN_HEIGHT, 150 + 18 * layers),
        margin={"l": 60, "r": 20, "t": 50, "b": 90},
    )
    return fig
