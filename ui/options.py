"""The attribution methods a visitor can tick, the "Method options" widgets generated from their configs, and the view
options both tabs share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer import METHODS, available_methods
from explainer.methods import method_choices as registered_methods
from explainer.methods import method_options
from explainer.methods.calibration import calibrate_command

from . import models
from .events import KEEP
from .guards.errors import user_errors
from .guards.markup import markdown_code

CALIBRATED = "macs_calibrated"  # offered only for a model with weights (`models.calibrated`)
DEFAULT_METHODS = ["macs", "rollout"]  # side by side on first use; the slower methods are opt-in, with time estimates
# Options the app sets otherwise than the library: MACS keeps its layer factors for the "MACS by layer" view
APP_DEFAULTS = {("macs", "keep_layers"): True}


def explains_images(method: str) -> bool:
    """Whether a method explains image prompts (the method's own `explains_images` fact)."""
    return bool(METHODS[method].explains_images)


def method_choices(image: bool = False) -> tuple[list[str], list[str]]:
    """(every registered method, the ones ticked on first use); for the image tab only methods that explain images
    are ticked, and never none."""
    choices = registered_methods()
    default = [m for m in DEFAULT_METHODS if m in choices and (not image or explains_images(m))]
    return choices, default or choices[:1]


def offered_choices(image: bool = False) -> list[str]:
    """The methods offered for the model: `method_choices`, without `macs_calibrated` when it has no weights."""
    known = models.calibrated(vision=image)
    choices = method_choices(image)[0]
    return [m for m in choices if m != CALIBRATED or known is None or known[1]]


def calibration_note(image: bool = False) -> str:
    """One Markdown line for a model without `macs_calibrated` weights: the command that makes them; else ""."""
    known = models.calibrated(vision=image)
    if known is None or known[1]:
        return ""
    command = markdown_code(f"python -m {calibrate_command(known[0], images=image)}")
    return f"*MACS (calibrated)* needs weights for this model: make them with {command}, then reload the page."


@dataclass
class MethodsView:
    """The methods box and its note, as both tabs name them."""

    methods: Any = KEEP  # the methods checkbox: its choices and ticks
    methods_note: Any = KEEP  # the calibration note under it (Markdown, hidden when empty)


def _offer(methods: list[str] | None, image: bool) -> MethodsView:
    if models.calibrated(vision=image) is None:  # no such model, or not known yet: the box stays as it is
        return MethodsView()
    choices = offered_choices(image)
    ticked = [m for m in methods or [] if m in choices]
    note = calibration_note(image)
    return MethodsView(gr.update(choices=choices, value=ticked), gr.update(value=note, visible=bool(note)))


@user_errors
def offer_methods(methods: list[str] | None) -> MethodsView:
    """On a page view: the text tab's methods for its model (no `macs_calibrated` without weights, and why)."""
    return _offer(methods, False)


@user_errors
def offer_image_methods(methods: list[str] | None) -> MethodsView:
    """On a page view: the image tab's methods for the vision-language model, as `offer_methods`."""
    return _offer(methods, True)


def option_keys() -> list[tuple[str, str]]:
    """(method, option) of every option of every registered method: the order of the option widgets."""
    return [(method, opt.name) for method in available_methods() for opt in method_options(method)]


def create_ui() -> tuple[Any, list[Any]]:
    """The "Method options" accordion, not rendered (`app.py` renders it below the tabs, which both use it), and
    its widgets in `option_keys()` order: one row per method, a checkbox for true/false, a number box for numbers,
    a menu for a fixed set of words. Call inside a Blocks context."""
    widgets = []
    with gr.Accordion("Method options (both tabs)", open=False, render=False) as box:
        gr.Markdown("Each method's settings, from its config; the defaults are the papers'. See the README, Methods.")
        for method in available_methods():
            with gr.Row(equal_height=True):
                gr.Markdown(f"**{method}**", min_height=0)
                for opt in method_options(method):
                    label, kw = f"{method}: {opt.name}", {"min_width": 180}
                    default = APP_DEFAULTS.get((method, opt.name), opt.default)
                    if opt.type is bool:
                        widget = gr.Checkbox(default, label=label, show_label=True, container=True, **kw)
                    elif opt.type in (int, float):
                        widget = gr.Number(default, label=label, precision=0 if opt.type is int else None, **kw)
                    elif opt.choices:
                        widget = gr.Dropdown(list(opt.choices), value=default, label=label, **kw)
                    else:
                        widget = gr.Textbox(str(default), label=label, **kw)
                    widgets.append(widget)
    return box, widgets


def chosen_options(methods: list[str], values: tuple | list) -> dict[str, dict[str, Any]]:
    """{method: {option: value}} of the selected methods from the option widgets' values (in `option_keys()`
    order); the library validates them and says what is wrong."""
    out: dict[str, dict[str, Any]] = {}
    for (method, name), value in zip(option_keys(), values):
        if method in methods and value is not None:
            out.setdefault(method, {})[name] = value
    return out


# Off: every map shows by default what its method computed, sinks included; the detection is a heuristic whose
# thresholds were checked on tiny test models only, so hiding tokens is the visitor's choice (one click).
HIDE_SINKS_DEFAULT = False
HIDE_SINKS_INFO = (
    "Attention sinks are prompt tokens (often the first one, or a few image patches) that take a large share of "
    "attention whatever the answer token. Ticked, they are left out of each map's z-scores and colour scale and drawn "
    "hatched, so the rest is readable. Off by default: the maps then show exactly what each method computed. Sinks "
    "are found while the answer is generated when an attention method (MACS, Attention Rollout) runs; they are "
    "listed in the JSON."
)


def sinks_toggle() -> Any:
    """The "Leave out attention sinks" checkbox, not rendered (`app.py` places it; both tabs' views read it)."""
    return gr.Checkbox(
        HIDE_SINKS_DEFAULT, label="Leave out attention sinks (both tabs)", info=HIDE_SINKS_INFO, render=False
    )
