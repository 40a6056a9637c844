"""The "Sources" accordion of the text tab: the passages of the prompt that support the answer, ranked by the Sources
method (`visuals.sources`), each a link to its place in the text. Follows the result and the step slider; never runs
the model (Sources runs with the answer when it is ticked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from visuals.sources import sources_html

from ..events import KEEP, Components
from ..guards import inputs
from ..guards.errors import user_errors
from ..stream import FOLLOWS_STEP


@dataclass
class SourcesView:
    """What the accordion's handler changes; `KEEP` leaves it as it is."""

    sources: Any = KEEP  # HTML


@user_errors
def render_sources(result: Any, step: float | None) -> SourcesView:
    """The ranked sources of the text tab's result at the step on the slider (1-based; None: the newest)."""
    return SourcesView(sources=sources_html(result, inputs.step_index(step)))


def create_ui() -> Components:
    """The accordion's components (call inside the text tab)."""
    c = Components()
    with gr.Accordion("Sources: which passages support the answer", open=False, elem_id="sources"):
        c["sources"] = gr.HTML(sources_html(None))
    return c


def create_event_handlers(c: Components, text: Components) -> None:
    gr.on(
        triggers=[text["result"].change, text["step"].change], **c.bind(render_sources, ("sources",)),
        inputs=[text["result"], text["step"]], api_name="render_sources", show_progress="hidden",
        trigger_mode="always_last", **FOLLOWS_STEP,
    )  # fmt: skip
