"""The page's first view and links that reopen a view, for presenters: `?result=<example id>&step=<k>`.

On the first page view (`demo.load`) the text tab shows a saved example's result without any model: the one the
page's address names (`result`: the example's id, the stem of its saved file, e.g. `reading-comprehension-qa`; `step`:
the answer token, 1-based), else the first example's; a link that names a step then scrolls the text tab's views
to the top of the window (`page.SCROLL_TO_STEP_JS`). Under the text tab a line gives the link to the example and
step shown. Links name the app's own saved examples only: the server never fetches an address a link gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gradio as gr

from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step

from .. import models, options
from ..events import KEEP, Components
from ..guards import inputs
from ..guards.errors import user_errors
from ..page import SCROLL_TO_STEP_JS
from ..stream import FOLLOWS_STEP, step_slider
from . import examples
from .text_tab import EXAMPLE, VIEWS_IN_TURN, TextView, open_example, render, then_export


def example_id(example: dict[str, str]) -> str:
    """An example's id in links: the stem of its saved file."""
    return Path(example.get("result") or example["label"]).stem


def linked(query: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(example index, 1-based step) a page address asks for; None for what it does not name (or names wrongly)."""
    ids = [example_id(e) for e in examples.examples()]
    index = ids.index(query["result"]) if query.get("result") in ids else None
    try:
        step = int(query["step"]) if index is not None and "step" in query else None
    except ValueError:
        step = None
    return index, step


@user_errors
def first_view(
    methods: list[str] | None, show_all: bool, span: bool, granularity: str, request: gr.Request | None = None
) -> TextView:
    """The first page view: the example and step the address names (`linked`), else the first example's saved
    result; never runs a model. Returns the `text_tab.EXAMPLE` fields."""
    query = dict(getattr(request, "query_params", None) or {})
    index, step = linked(query)
    view = open_example(index, methods, show_all, span, granularity)
    attr = view.result
    if step is None or not isinstance(attr, Attribution) or span or attr.num_steps == 0:
        return view
    step = clamp_step(step - 1, attr.num_steps) + 1
    drawn = render(attr, view.methods["value"], step, show_all, False, None, granularity)
    slider = step_slider(attr, False, step)
    return dataclasses.replace(view, step=slider, answer=drawn.answer, heatmap=drawn.heatmap, table=drawn.table)


@dataclasses.dataclass
class LinkView:
    """What the link handler changes."""

    link: Any = KEEP  # the "link to this view" line


@user_errors
def link_line(result: Attribution | None, step: float | None) -> LinkView:
    """The line with the link to the saved example and step shown (empty for any other result)."""
    saved = (result.meta.get("saved") or {}) if isinstance(result, Attribution) else {}
    shown = [e for e in examples.examples() if e["prompt"] == saved.get("prompt")]
    if not shown or not result.num_steps:
        return LinkView(link="")
    k = clamp_step(inputs.step_index(step), result.num_steps) + 1
    query = f"?result={example_id(shown[0])}&step={k}"
    return LinkView(link=f"Link to this view (saved example, step {k}): [{query}]({query})")


def create_ui() -> Components:
    """The link line (call inside the text tab)."""
    return Components(link=gr.Markdown("", elem_id="text-view-link"))


def create_event_handlers(blocks: gr.Blocks, c: Components, text: Components) -> None:
    """The first page view (then the model line, which names the model; it loads with the first request, and the
    downloads of the result shown), and the link line following the text tab's result and step."""
    asked = text("methods", "show_all", "span", "granularity")
    shown = blocks.load(**text.bind(first_view, EXAMPLE), inputs=asked, api_name="first_view", **VIEWS_IN_TURN)
    shown.then(models.model_info, outputs=text["model"], api_name="model_info")
    shown.then(
        **text.bind(options.offer_methods, ("methods", "methods_note")), inputs=text("methods"),
        api_name="offer_methods", show_progress="hidden", **VIEWS_IN_TURN,
    )  # fmt: skip
    shown.then(  # a link to a step brings that step's views into the window (only a scroll, in the browser)
        None, js=SCROLL_TO_STEP_JS, api_name="scroll_to_step", api_visibility="private", queue=False,
        show_progress="hidden",
    )  # fmt: skip
    then_export(text, shown, "export_files_after_first_view", "export_view_after_first_view")  # its downloads
    gr.on(
        triggers=[text["result"].change, text["step"].change], **c.bind(link_line, ("link",)),
        inputs=text("result", "step"), api_name="view_link", trigger_mode="always_last", show_progress="hidden",
        queue=False, **FOLLOWS_STEP,
    )  # fmt: skip
