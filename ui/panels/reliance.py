"""The image tab's reliance strip, above the overlays: the answer with every token coloured by how much it relied on
the image (`visuals.reliance`), the token on the step slider outlined and described. It follows the tab's result and
step slider; it never runs the model (the library measures the reliance with the answer, `explainer/reliance.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer.result.attribution import Attribution
from visuals.reliance import reliance_html

from ..events import KEEP, Components
from ..guards import inputs
from ..guards.errors import user_errors
from ..stream import FOLLOWS_STEP


@dataclass
class RelianceView:
    """What the strip's handler changes (a field of the tab's components); `KEEP` leaves it as it is."""

    reliance: Any = KEEP  # the strip (HTML)


@user_errors
def render_reliance(result: Any, step: float | None) -> RelianceView:
    """The strip of the tab's result (an image result holding an `Attribution`, or one) at the step on the slider
    (1-based; None: the last); empty before the first question."""
    attr = getattr(result, "attr", result)
    if not isinstance(attr, Attribution):
        return RelianceView(reliance="")
    return RelianceView(reliance=reliance_html(attr, inputs.step_index(step)))


def attach(tab: Components, elem_id: str = "image-reliance") -> None:
    """Place the strip where this is called in the tab's layout (its `result` and `step` must exist) as
    `tab["reliance"]`, and let it follow them. An internal event: not part of the public API."""
    tab["reliance"] = gr.HTML("", elem_id=elem_id)
    gr.on(
        triggers=[tab["result"].change, tab["step"].change], **tab.bind(render_reliance, ("reliance",)),
        inputs=tab("result", "step"), api_name="render_image_reliance",
        trigger_mode="always_last", show_progress="hidden", **FOLLOWS_STEP,
    )  # fmt: skip
