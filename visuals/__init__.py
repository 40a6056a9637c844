"""Pure views of an `Attribution` (HTML, Plotly figures, table rows): no model, no torch, no UI framework."""

from visuals.curves import TABLE_HEADERS as FAITHFULNESS_HEADERS
from visuals.curves import faithfulness_rows, removal_figure, soft_figure
from visuals.heatmap import (
    Z_CLIP,
    answer_html,
    bin_class,
    bin_color,
    diverging_color,
    side_by_side_html,
    top_tokens_rows,
    visible_whitespace,
)
from visuals.overlay import colormap, gif_bytes, image_overlay, overlay_grid

__all__ = [
    "FAITHFULNESS_HEADERS",
    "faithfulness_rows",
    "removal_figure",
    "soft_figure",
    "Z_CLIP",
    "answer_html",
    "bin_class",
    "bin_color",
    "colormap",
    "image_overlay",
    "gif_bytes",
    "overlay_grid",
    "diverging_color",
    "side_by_side_html",
    "top_tokens_rows",
    "visible_whitespace",
]
