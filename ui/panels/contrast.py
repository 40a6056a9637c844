"""The text tab's contrast accordion: "why did the model write this token rather than that one?"

For the step on the slider the visitor picks a foil from the model's most probable alternatives at that step (kept
with every result, `meta["alternatives"]`) or types one, and the answer shown is explained again, teacher-forced,
with that step contrastive: AtMan and the gradient methods explain logit(token) - logit(foil) there, and the attention
methods say that they cannot (`explainer/contrast.py`). When none of the ticked methods can be contrastive (the
default MACS and Rollout), AtMan is added and ticked, as the public `/contrast` does: a contrast of attention maps
alone would explain nothing. The new result replaces the one shown, opened on that step.
"""

from __future__ import annotations

import dataclasses
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer.errors import InputError
from explainer.methods import METHODS, method_class
from explainer.request import ExplainRequest
from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step

from .. import gpu_time, models
from ..events import KEEP, Components, settle
from ..guards import admission, inputs
from ..guards.errors import user_errors
from ..options import chosen_options
from ..stream import FOLLOWS_STEP, Phase, explain_updates, finished, step_slider
from ..tabs.text_tab import SHOWN, VIEWS_IN_TURN, TextView, after_explain, render, result_view, then_export

NOTE = (
    "Pick a **foil** for the token on the step slider: one of the model's most probable alternatives at that step, "
    "or type a token. The answer is explained again with that step contrastive: **AtMan** scores each prompt "
    "token by how much hiding it changes log p(token) - log p(foil), and the **gradient methods** (Input × Gradient, "
    "Grad-ELLM, AttnLRP) explain the logit difference. MACS, Rollout and random cannot be contrastive (attention "
    "does not depend on the target), so at that step they show a note instead of a map; with none of the ticked "
    "methods contrastive, **AtMan** is added."
)
CONTRAST_METHOD = "atman"  # run when none of the methods asked for can be contrastive (the page and /contrast)
ADDED = (
    "None of the ticked methods can be contrastive (an attention map does not depend on the target), so AtMan was "
    "added to explain this step against the foil."
)
NO_RESULT = "Generate an answer first: the foils are the model's alternatives at the step on the slider."


@dataclass
class ContrastView:
    """What a contrast handler changes in its own components; `KEEP` leaves a component as it is."""

    foil: Any = KEEP  # the alternatives dropdown


def _choices(result: Attribution, index: int) -> list[tuple[str, str]]:
    """(label, token id as text) of the step's alternatives other than the answer's own token."""
    kept = result.meta.get("alternatives") or []  # results saved before alternatives were kept have none
    alternatives = kept[index] if index < len(kept) else []
    own = result.generated_token_ids[index]
    return [(f"{a['token']!r} · p = {a['p']:.3f}", str(a["id"])) for a in alternatives if a["id"] != own]


@user_errors
def foil_choices(result: Attribution | None, step: float | None) -> ContrastView:
    """The alternatives of the step on the slider as the dropdown's choices, the most probable one selected."""
    index = clamp_step(inputs.step_index(step), result.num_steps) if isinstance(result, Attribution) else None
    if index is None:
        return ContrastView(foil=gr.update(choices=[], value=None))
    choices = _choices(result, index)
    return ContrastView(foil=gr.update(choices=choices, value=choices[0][1] if choices else None))


def contrastive_methods(methods: list[str]) -> list[str]:
    """The methods a contrast runs: those asked for, and AtMan (`CONTRAST_METHOD`) when none of them can be
    contrastive (read from each method's `contrastive` flag; names the registry does not know are left to the
    request's check)."""
    known = [m for m in methods if isinstance(m, str) and m.strip().lower() in METHODS]
    if any(method_class(m).contrastive for m in known):
        return list(methods)
    return [*methods, CONTRAST_METHOD]


def _foil(picked: Any, typed: Any) -> int | str:
    """The foil the visitor chose: typed text wins over the dropdown (whose values are token ids)."""
    if isinstance(typed, str) and typed != "":
        return typed
    if picked in (None, ""):
        raise InputError("Pick a foil from the alternatives, or type a token.")
    try:
        return int(picked)
    except (TypeError, ValueError):
        raise InputError(f"Not a token id: {picked!r}.") from None


def contrast_request(
    prompt: str, methods: list[str], chat_template: bool, show_all: bool, granularity: str, result: Any,
    step: float | None, picked: Any, typed: Any, *options: Any,
) -> ExplainRequest:  # fmt: skip
    """The accordion's request (the arguments of `explain_contrast`, which `contrast_seconds` reads too): the answer
    shown, teacher-forced (its ids), the prompt in the box, and the step on the slider contrastive against the foil.

    Raises:
        InputError: no finished result, no foil, no method, or what the request refuses (`ExplainRequest`).
    """
    if not isinstance(result, Attribution) or not finished(result) or result.num_steps == 0:
        raise InputError(NO_RESULT)
    index = clamp_step(inputs.step_index(step), result.num_steps)
    foil = _foil(picked, typed)
    methods = contrastive_methods(inputs.chosen_methods(methods))
    return ExplainRequest(
        prompt, methods, chosen_options(methods, options), max_new_tokens=result.num_steps,
        chat_template=bool(chat_template), answer=tuple(result.generated_token_ids), contrast={index: foil},
        unit=granularity or "token",
    )  # fmt: skip


@user_errors
async def explain_contrast(
    prompt: str,
    methods: list[str],
    chat_template: bool,
    show_all: bool,
    granularity: str,
    result: Attribution | None,
    step: float | None,
    picked: Any,
    typed: Any,
    *options: Any,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> Any:
    """Explain the answer shown again (teacher-forced, the prompt in the box) with the step on the slider
    contrastive against the chosen foil (`contrast_request`); yields text-tab views (`text_tab.SHOWN` and the
    methods box, which ticks AtMan where it was added), the last one on that step."""
    asked = (prompt, methods, chat_template, show_all, granularity, result, step, picked, typed)
    request = contrast_request(*asked, *options)
    (index,) = request.contrast
    added = [m for m in request.method_names if m not in (methods or [])]
    methods, granularity = list(request.method_names), request.unit
    updates = explain_updates(models.get_bundle(), request, progress)
    if added:
        yield TextView(methods=gr.update(value=methods))  # tick AtMan: the views follow the box
    async with aclosing(updates):
        async for update in updates:
            if update.item is None:
                yield TextView(status=update.note or KEEP, request=update.request)
                continue
            live = update.request.phase is not Phase.DONE and not finished(update.item)
            view = result_view(update.item, methods, show_all, live, False, granularity)
            if not live:  # open the finished result on the contrasted step
                drawn = render(update.item, methods, index + 1, show_all, False, None, granularity)
                slider = step_slider(update.item, False, index + 1)
                view = dataclasses.replace(
                    view, step=slider, answer=drawn.answer, heatmap=drawn.heatmap, table=drawn.table
                )
                if added:
                    view = dataclasses.replace(view, status=f"{view.status} {ADDED}")
            yield dataclasses.replace(view, request=update.request)


def contrast_seconds(*asked: Any, **_: Any) -> int:
    """GPU seconds for `explain_contrast`: its request (`contrast_request`), as long as the answer shown."""
    return gpu_time.seconds_of(lambda: contrast_request(*asked))


def create_ui() -> Components:
    """The contrast accordion's components (call inside the text tab, below its views)."""
    c = Components()
    with gr.Accordion("Why this token and not another? (contrast)", open=False):
        gr.Markdown(NOTE)
        with gr.Row(equal_height=True):
            c["foil"] = gr.Dropdown([], label="Foil: the model's alternatives at this step", allow_custom_value=False)
            c["typed"] = gr.Textbox(label="…or type a token", placeholder="e.g. ' London' (one token)")
            c["run"] = gr.Button("Explain against the foil")
    return c


def create_event_handlers(c: Components, text: Components, option_widgets: list[Any]) -> None:
    """Wire the accordion to the text tab: its result and step slider choose the alternatives, and the request's
    views are the text tab's."""
    hidden = {"show_progress": "hidden"}
    gr.on(  # `change`, not `input`: a finished request moves the slider itself (a contrast request to its step)
        triggers=[text["step"].change, text["result"].change], **c.bind(foil_choices, ("foil",)),
        inputs=[text["result"], text["step"]], api_name="foil_choices", queue=False, trigger_mode="always_last",
        **FOLLOWS_STEP, **hidden,
    )  # fmt: skip
    asked = text("prompt", "methods", "chat_template", "show_all", "granularity", "result", "step")
    event = c["run"].click(
        **text.bind(explain_contrast, SHOWN + ("methods",), gpu=True, duration=contrast_seconds, gate=admission.MODEL),
        inputs=asked + c("foil", "typed") + option_widgets,
        api_name="explain_contrast",
        show_progress_on=text["status"],
    )
    text["cancel"].click(None, cancels=[event])
    after = text("result", "request", "methods", "show_all", "span", "granularity")
    settled = settle(
        event, **text.bind(after_explain, SHOWN), inputs=after, api_name="after_contrast", **hidden, **VIEWS_IN_TURN
    )
    then_export(text, settled, "export_files_after_contrast", "export_view_after_contrast")
