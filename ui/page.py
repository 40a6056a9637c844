"""The page's frame around the tabs: its style sheet (a first screen that shows a result), run buttons that show they
are busy, and the scroll a share link asks for.

A live demo is watched on a laptop or a projector, 1280×900 or 1920×1080. Each tab keeps its controls in a side
column and its views beside them (`text_tab.create_ui`), so the answer, the step slider and the method panels side by
side are on the first screen; the accordions (contrast, layers, regions, sources, faithfulness) follow below. On a
narrow window the columns stack, controls first; a link to a step (`share.py`) then scrolls down to the views.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from .events import settle
from .guards.errors import wrap_handler

VIEWS_ID = "text-views"  # the text tab's views column: what a share link scrolls to
VIEWS_CLASS = "xai-views"  # both tabs' views columns
CSS = (
    # Gradio's prose style draws borders around table cells and squeezes narrow columns: top-sentence tables have
    # neither
    ".xai-top table,.xai-top tr,.xai-top th,.xai-top td{border:none !important;background:none}"
    ".xai-top tbody tr{border-top:1px solid #d0d7de !important}.xai-top{margin-top:8px}"
    ".xai-top td:nth-child(-n+2),.xai-top th:nth-child(-n+2){white-space:nowrap;width:1%}"
    # the header: the title and the help in little height; the shared sinks toggle's long note shows two lines until
    # it is hovered or focused
    "#xai-header h1{font-size:1.5rem !important;margin:0 0 4px !important}#xai-header p{margin:0 !important}"
    "#xai-header .info-text{display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;overflow:hidden}"
    "#xai-header .block:hover .info-text,#xai-header .block:focus-within .info-text{display:block}"
    # the status line (it carries the progress bar) keeps its place while it is empty, so the views do not jump
    ".xai-status{min-height:2.6em}.xai-status p{font-size:13px !important;line-height:1.45 !important}"
    # the panels side by side in a column two thirds wide: a little smaller type, so a QA prompt's panels fit the
    # first screen (the id outranks the heatmap's own class rules)
    f"#{VIEWS_ID} .xai-flow{{font-size:14px;line-height:1.7}}"
    # the views' HTML cards line up with the blocks around them (Gradio pads an HTML component's content)
    f".{VIEWS_CLASS} .html-container{{padding:0}}"
)
# Run on the first view's end (share.py): a link that names a step scrolls that step's views to the top of the window.
# It only scrolls; it fetches nothing.
SCROLL_TO_STEP_JS = f"""() => {{
  if (!new URLSearchParams(window.location.search).has("step")) return;
  const go = () => document.getElementById("{VIEWS_ID}")?.scrollIntoView({{block: "start"}});
  requestAnimationFrame(() => requestAnimationFrame(go));
}}"""


def busy_on_click(button: Any, busy_label: str, api: str) -> None:
    """A click on `button` makes it read `busy_label` and cannot be pressed again until `ready_after` frees it.
    Register it before the button's request: Gradio dropped this update when the request was registered first.

    The busy state is set in the browser, in the click itself: a server round trip could arrive after a request that
    failed at once had already made the button ready again."""
    update = json.dumps({"__type__": "update", "value": busy_label, "interactive": False})
    hidden = {"show_progress": "hidden", "queue": False, "api_visibility": "private"}
    button.click(None, outputs=button, js=f"() => ({update})", api_name=f"{api}_busy", **hidden)


def ready_after(event: Any, button: Any, api: str) -> None:
    """Once `event` ends (done, failed or cancelled), `button` is itself again (`events.settle`: after an error too)."""
    label = button.value
    ready = wrap_handler(lambda: gr.update(value=label, interactive=True))
    hidden = {"show_progress": "hidden", "queue": False, "api_visibility": "private"}
    settle(event, fn=ready, outputs=button, api_name=f"{api}_ready", **hidden)
