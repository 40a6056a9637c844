"""The "MACS by layer" accordion (text and image tabs): for the answer token on the step slider, every layer's MACS
factor over the prompt and their product (`visuals.layers`), so a visitor sees which layer cut a token's score.

MACS keeps the factors when its option `keep_layers` is on (the app turns it on, `options.APP_DEFAULTS`); they are
read from the device once the answer is complete, so the view appears then. Never runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer.result.attribution import Attribution
from visuals.layers import has_layers, layer_figure, layer_positions

from ..events import KEEP, Components
from ..guards import inputs
from ..guards.errors import user_errors
from ..stream import FOLLOWS_STEP

NOTE = (
    "MACS multiplies, over the layers, each layer's factor α·(max over heads of the attention to a prompt token) + "
    "(1 − α) (MACS paper, Eq. 6-7). Each row below is one layer's factor for the answer token on the step slider, "
    "the bottom row their product (MACS before z-scoring): a token with a low score was cut by the layers where it "
    "is dark. Hover a cell for its layer, token and value."
)
NO_RESULT = "Generate an answer with **MACS** ticked: its layers appear here when the answer is complete."
LIVE = "The layers appear when the answer is complete (a stopped request has none)."
NO_LAYERS = (
    "This result has no MACS layers: tick **MACS** and keep **macs: keep_layers** on (Method options), then "
    "generate again. A saved file has them when written with `python -m explainer explain --json ... --macs-layers`."
)


@dataclass
class LayersView:
    """What the accordion's handler changes; `KEEP` leaves a component as it is."""

    plot: Any = KEEP  # the figure, or None
    note: Any = KEEP  # what the figure shows, or why there is none


def _attr(result: Any) -> Attribution | None:
    """The tab's result: an `Attribution` (text tab) or an image result holding one (`.attr`)."""
    attr = getattr(result, "attr", result)
    return attr if isinstance(attr, Attribution) else None


@user_errors
def render_layers(result: Any, step: float | None, show_all: bool = False) -> LayersView:
    """The layer view of the step on the slider (1-based; None: the newest) of the tab's result, over the user's text
    (and image) or, with `show_all`, every prompt token; a note instead while there is nothing to show."""
    attr = _attr(result)
    if attr is None or "macs" not in attr.methods:
        return LayersView(plot=None, note=NO_RESULT)
    if not has_layers(attr):
        live = attr.meta.get("status", "done") != "done"  # files saved before the status was kept are finished
        return LayersView(plot=None, note=LIVE if live else NO_LAYERS)
    positions = layer_positions(attr, bool(show_all))
    return LayersView(plot=layer_figure(attr, inputs.step_index(step), positions), note=NOTE)


def create_ui(elem_id: str = "macs-layers") -> Components:
    """The accordion's components (call inside a tab, below its views); `elem_id` names it on the page."""
    c = Components()
    with gr.Accordion("MACS by layer", open=False, elem_id=elem_id):
        c["note"] = gr.Markdown(NO_RESULT)
        c["plot"] = gr.Plot(label="MACS factors per layer at this step", show_label=False)
    return c


def create_event_handlers(c: Components, tab: Components, api: str = "render_layers") -> None:
    """Follow the tab's result and step slider (and its "show all tokens" box, if it has one)."""
    shown = [tab["result"], tab["step"]] + ([tab["show_all"]] if "show_all" in tab else [])
    triggers = [tab["result"].change, tab["step"].change] + ([tab["show_all"].change] if "show_all" in tab else [])
    gr.on(
        triggers=triggers, **c.bind(render_layers, ("plot", "note")), inputs=shown, api_name=api,
        trigger_mode="always_last", show_progress="hidden", **FOLLOWS_STEP,
    )  # fmt: skip
