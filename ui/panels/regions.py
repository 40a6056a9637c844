"""The "Which answer tokens used this?" accordions: select an image region (image tab) or words of the prompt (text
tab), and see per method how strongly each answer token drew on them (`explainer.result.regions`, `visuals.regions`).

In the image tab the visitor clicks the image's patch grid: "Pick cells" toggles the clicked cell, "Rectangle" takes
two clicks, opposite corners, and selects every cell between. Never runs the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer.result.attribution import Attribution
from explainer.result.regions import cell_at, cells_in_box, image_region_strengths, word_choices, word_region_strengths
from explainer.result.steps import clamp_step
from visuals.regions import grid_picker, picker_size, region_figure

from ..events import KEEP, Components, in_turn
from ..guards import inputs
from ..guards.errors import user_errors
from ..stream import FOLLOWS_STEP

MODES = ("Pick cells", "Rectangle (click two corners)")
IMAGE_NOTE = (
    "Click the image's patch grid to select a region (each cell is one image token). The chart shows, for each answer "
    "token, the mean z-score of the selected cells in each method's map (0: an average cell; the step on the slider "
    "is shaded): which answer tokens used this part of the image."
)
TEXT_NOTE = (
    "Choose words of your prompt. The chart shows, for each answer token, the mean z-score of their tokens in each "
    "method's map over your text (0: an average token; the step on the slider is shaded): which answer tokens used "
    "these words."
)
NO_RESULT = "Generate an answer first."
EMPTY_SELECTION = {"cells": [], "corner": None, "image": 0}


@dataclass
class RegionView:
    """What the accordions' handlers change; `KEEP` leaves a component as it is."""

    picker: Any = KEEP  # the image with its grid and selection (image tab)
    selection: Any = KEEP  # {"cells": [[row, col], ...], "corner": [row, col] | None, "image": index}
    which: Any = KEEP  # the image chooser's update, shown with several images
    words: Any = KEEP  # the word dropdown's update (text tab)
    plot: Any = KEEP
    note: Any = KEEP


def _attr(result: Any) -> Attribution | None:
    attr = getattr(result, "attr", result)
    return attr if isinstance(attr, Attribution) else None


def apply_click(selection: dict | None, cell: tuple[int, int], mode: str) -> dict:
    """The selection after a click on `cell`: toggled in "Pick cells" mode; in rectangle mode the first click marks a
    corner and the second selects the rectangle between the two."""
    selection = selection or EMPTY_SELECTION
    cells, corner, image = [tuple(c) for c in selection["cells"]], selection.get("corner"), selection.get("image", 0)
    if mode == MODES[1]:
        if corner is None:
            return {"cells": [list(c) for c in cells], "corner": list(cell), "image": image}
        box = cells_in_box(tuple(corner), cell)
        return {"cells": [list(c) for c in box], "corner": None, "image": image}
    cells = [c for c in cells if c != cell] if cell in cells else [*cells, cell]
    return {"cells": [list(c) for c in cells], "corner": None, "image": image}


def _valid(selection: dict | None, attr: Attribution) -> dict:
    """The selection with an image of this result and cells inside its grid (a new question may have other
    images)."""
    selection = selection or EMPTY_SELECTION
    image = selection.get("image", 0) if 0 <= selection.get("image", 0) < len(attr.images) else 0
    h, w = attr.images[image]["grid"]
    inside = [list(c) for c in selection["cells"] if 0 <= c[0] < h and 0 <= c[1] < w]
    corner = selection.get("corner")
    corner = corner if corner and corner[0] < h and corner[1] < w and image == selection.get("image", 0) else None
    return {"cells": inside if image == selection.get("image", 0) else [], "corner": corner, "image": image}


def _chooser(attr: Attribution, image: int) -> dict:
    names = [f"image {i + 1}" for i in range(len(attr.images))]
    return gr.update(choices=names, value=names[image], visible=len(names) > 1)


@user_errors
def render_image_region(result: Any, selection: dict | None, methods: list[str], step: float | None) -> RegionView:
    """The picker and, once cells are selected, the chart for the image tab's result."""
    attr = _attr(result)
    if attr is None or not attr.image or not attr.num_steps:
        return RegionView(picker=None, plot=None, note=NO_RESULT, which=gr.update(visible=False))
    selection = _valid(selection, attr)
    cells, image = [tuple(c) for c in selection["cells"]], selection["image"]
    picker = grid_picker(result.images[image], attr.images[image]["grid"], cells, selection["corner"])
    shown = RegionView(picker=picker, selection=selection, plot=None, note=IMAGE_NOTE, which=_chooser(attr, image))
    if not cells:
        return shown
    strengths = image_region_strengths(attr, methods or list(attr.methods), cells, image)
    plot = region_figure(attr, strengths, clamp_step(inputs.step_index(step), attr.num_steps))
    count = f"{len(cells)} cell{'s' * (len(cells) != 1)}"
    return dataclasses.replace(shown, plot=plot, note=f"{IMAGE_NOTE} **{count}.**")


def pick_cell(
    result: Any, selection: dict | None, mode: str, methods: list[str], step: float | None, evt: gr.SelectData
) -> RegionView:
    """A click on the picker at `evt.index` = (x, y) pixels of the picker image."""
    attr = _attr(result)
    if attr is None or not attr.image:
        return RegionView(note=NO_RESULT)
    selection = _valid(selection, attr)
    record = attr.images[selection["image"]]
    cell = cell_at({"grid": record["grid"], "size": picker_size(record["size"])}, *evt.index[:2])
    return render_image_region(result, apply_click(selection, cell, mode), methods, step)


def clear_region(result: Any, selection: dict | None, methods: list[str], step: float | None) -> RegionView:
    """No cells selected, on the same image."""
    image = (selection or EMPTY_SELECTION).get("image", 0)
    return render_image_region(result, {**EMPTY_SELECTION, "image": image}, methods, step)


def choose_image(result: Any, which: str | None, methods: list[str], step: float | None) -> RegionView:
    """Another image of the question ("image 2"): its grid, nothing selected."""
    index = int(str(which).split()[-1]) - 1 if which else 0
    return render_image_region(result, {**EMPTY_SELECTION, "image": index}, methods, step)


@user_errors
def render_word_region(result: Any, chosen: list[str] | None, methods: list[str], step: float | None) -> RegionView:
    """The word dropdown's choices (kept where still valid) and the chart for the chosen words of the text tab's
    result."""
    attr = _attr(result)
    if attr is None or not attr.num_steps:
        return RegionView(words=gr.update(choices=[], value=[]), plot=None, note=NO_RESULT)
    labels = [label for label, _ in word_choices(attr)]
    chosen = [c for c in chosen or [] if c in labels]
    words = gr.update(choices=labels, value=chosen)
    if not chosen:
        return RegionView(words=words, plot=None, note=TEXT_NOTE)
    strengths = word_region_strengths(attr, methods or list(attr.methods), chosen)
    plot = region_figure(attr, strengths, clamp_step(inputs.step_index(step), attr.num_steps))
    return RegionView(words=words, plot=plot, note=TEXT_NOTE)


def create_ui(image: bool, elem_id: str) -> Components:
    """The accordion's components (call inside the tab, below its views): a grid picker for the image tab, a word
    list for the text tab."""
    c = Components()
    with gr.Accordion("Which answer tokens used this?", open=False, elem_id=elem_id):
        c["note"] = gr.Markdown(NO_RESULT)
        if image:
            c["selection"] = gr.State(EMPTY_SELECTION)
            with gr.Row():
                c["picker"] = gr.Image(label="Click the grid", interactive=False, type="pil", height=360)
                with gr.Column():
                    c["which"] = gr.Radio(["image 1"], value="image 1", label="Image", visible=False)
                    c["mode"] = gr.Radio(list(MODES), value=MODES[0], label="A click")
                    c["clear"] = gr.Button("Clear the selection")
        else:
            c["words"] = gr.Dropdown([], value=[], multiselect=True, label="Words of the prompt")
        c["plot"] = gr.Plot(label="Mean z-score of the selection per answer token", show_label=False)
    return c


def create_event_handlers(c: Components, tab: Components, api: str) -> None:
    """Follow the tab's result, methods and step slider; clicks (image) or the word list (text) select."""
    watched = [tab["result"].change, tab["step"].change, tab["methods"].change]
    hidden = {"show_progress": "hidden", "trigger_mode": "always_last", **FOLLOWS_STEP}
    if "picker" in c:
        shown = ("picker", "selection", "which", "plot", "note")
        turn = in_turn(api)  # four listeners draw the panel and update the selection: in the order they arrive
        gr.on(
            triggers=watched, **c.bind(render_image_region, shown),
            inputs=[tab["result"], c["selection"], tab["methods"], tab["step"]], api_name=api, **hidden, **turn,
        )  # fmt: skip
        c["picker"].select(
            **c.bind(pick_cell, shown), inputs=[tab["result"], c["selection"], c["mode"], tab["methods"], tab["step"]],
            api_name=f"{api}_pick", show_progress="hidden", **turn,
        )  # fmt: skip
        c["clear"].click(
            **c.bind(clear_region, shown), inputs=[tab["result"], c["selection"], tab["methods"], tab["step"]],
            api_name=f"{api}_clear", show_progress="hidden", **turn,
        )  # fmt: skip
        c["which"].input(
            **c.bind(choose_image, shown), inputs=[tab["result"], c["which"], tab["methods"], tab["step"]],
            api_name=f"{api}_image", show_progress="hidden", **FOLLOWS_STEP, **turn,
        )  # fmt: skip
        return
    shown = ("words", "plot", "note")
    gr.on(
        triggers=[*watched, c["words"].input], **c.bind(render_word_region, shown),
        inputs=[tab["result"], c["words"], tab["methods"], tab["step"]], api_name=api, **hidden,
    )  # fmt: skip
