"""Pure views of an `Attribution` (HTML, Plotly figures, table rows): no model, no torch, no UI framework."""

from visuals.heatmap import (
    Z_CLIP,
    answer_html,
    diverging_color,
    side_by_side_html,
    token_heatmap_figure,
    token_heatmap_html,
    top_tokens_rows,
    visible_whitespace,
)

__all__ = [
    "Z_CLIP",
    "answer_html",
    "diverging_color",
    "side_by_side_html",
    "token_heatmap_figure",
    "token_heatmap_html",
    "top_tokens_rows",
    "visible_whitespace",
]
