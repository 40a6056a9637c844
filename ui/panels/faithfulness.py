"""The text tab's faithfulness accordion: removal curves (MIF / LIF / SRG) and pi-Soft of the result shown."""

from __future__ import annotations

import dataclasses
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer.errors import InputError
from explainer.estimate import seconds_at
from explainer.faithfulness import (
    MEASURING_SOFT,
    QUICK_SOFT,
    REMOVAL_METRICS,
    FaithfulnessReport,
    soft_cost,
    stream_faithfulness,
)
from explainer.faithfulness.common import RANKED
from explainer.result.attribution import Attribution
from visuals.curves import TABLE_HEADERS, faithfulness_rows, removal_figure, soft_figure
from visuals.lds import lds_caption, lds_figure

from .. import gpu_time, models
from ..events import KEEP, Components, in_turn, settle
from ..guards import admission
from ..guards.errors import user_errors
from ..guards.markup import markdown_text
from ..stream import FOLLOWS_STEP, Phase, RequestState, run_stream
from .measurement import SOFT_CHOICES, faithfulness_request, is_image_result, measured, soft_steps

REMOVAL_METRIC_KEYS = {m.label: m.key for m in REMOVAL_METRICS}  # the metric menu's labels -> the library's keys
MEASURING = "Measuring the removal curves…"  # the status note until the first report
# π-Soft calibrates a method's scores into keep probabilities: random orderings have none (`explainer.faithfulness.
# soft`), so its plot has a random curve only for the random method's own scores, when the result has them
SOFT_RANDOM = "has no random curve unless the method *random* was ticked (its scores are then measured, dashed)"
NOTE = (
    "**Removal curves** (MACS paper, App. A.2): 0-20% of your text's tokens are hidden by attention masking, most "
    "(MIF) or least (LIF) influential first by the method's step-averaged score, and the answer is re-generated; "
    "SRG = AUC(LIF) - AUC(MIF), higher is better (for perplexity more negative). **π-Soft** (Grad-ELLM paper, "
    "section 3.1): input embeddings kept with probability calibrated to π; higher is better. Quick setting here: "
    f"{QUICK_SOFT.samples} samples per π, π = {', '.join(str(p) for p in QUICK_SOFT.pis)}, for the step on the "
    "slider or every 5th answer token (the paper uses 15 samples, π step 0.05 and every 5th token: "
    "`python -m explainer faithfulness --soft paper`). The removal curves add a random baseline (random orderings, "
    f"dashed); π-Soft {SOFT_RANDOM}. Removal curves appear first (seconds), π-Soft after; **Cancel** stops the work. "
    "**LDS on this answer** (beside the curves): with *sources* ticked, each method's unit scores predict the answer's "
    "log-probability under Sources' own removals (ContextCite's linear datamodeling score), at no extra pass."
)

IMAGE_NOTE = (
    "**Removal curves over the image** (MACS paper, App. A.2): 0-20% of the image tokens (merged patches) are hidden "
    "from the model by attention masking, most (MIF) or least (LIF) influential first by the method's step-averaged "
    "score, and the answer is re-generated; SRG = AUC(LIF) - AUC(MIF), higher is better (for perplexity more "
    "negative). *Tokens ranked* can add the question's tokens. The random baseline (random orderings) is dashed; "
    "π-Soft is measured on text prompts only. **Cancel** stops the work."
)


@dataclass
class FaithfulnessView:
    """What a faithfulness handler changes, one field per component of `create_ui`; `KEEP` leaves it as it is."""

    removal: Any = KEEP  # removal-curve figure
    lds: Any = KEEP  # each method's LDS on this answer (bar chart), from Sources' ablations
    lds_note: Any = KEEP  # how it was measured, and the surrogate's own fit (or why there is none)
    soft: Any = KEEP  # pi-Soft figure
    table: Any = KEEP  # summary rows
    status: Any = KEEP  # the panel's status line
    report: Any = KEEP  # State: the FaithfulnessReport shown
    request: Any = KEEP  # State: the RequestState of the newest measurement
    cost: Any = KEEP  # what pi-Soft will cost, before it starts


FIGURES = ("removal", "lds", "lds_note", "soft", "table")  # what `render_faithfulness` draws from a report
SHOWN = FIGURES + ("status", "report", "request")


@user_errors
def render_faithfulness(report: FaithfulnessReport | None, metric: str) -> FaithfulnessView:
    """Removal curves of the chosen metric, pi-Soft curves and summary rows of a stored report; never runs the model."""
    if report is None:
        return FaithfulnessView(removal=None, lds=None, lds_note="", soft=None, table=[])
    key = REMOVAL_METRIC_KEYS.get(metric, "logit")
    removal = removal_figure(report.removal, key) if report.removal else None
    soft = soft_plot(report)
    lds = lds_figure(report.lds) if report.lds is not None and report.lds.lds else None
    lds = gr.update(value=lds, visible=lds is not None)  # without Sources' ablations the note says why, no frame
    return FaithfulnessView(removal=removal, lds=lds, lds_note=lds_caption(report.lds), soft=soft,
                            table=faithfulness_rows(report))  # fmt: skip


def soft_plot(report: FaithfulnessReport) -> Any:
    """The pi-Soft plot of a report: its figure, or an empty plot kept in the page only while pi-Soft is measured (a
    measurement that skipped it would otherwise leave an empty frame under the removal curves)."""
    if report.soft is not None:
        return gr.update(value=soft_figure(report.soft), visible=True)
    return gr.update(value=None, visible=report.status.endswith(MEASURING_SOFT))


def _soft_seconds(result: Attribution, methods: list[str], steps: Any, report: FaithfulnessReport | None) -> Any:
    """pi-Soft's expected time at the speed the removal curves ran at (None before they ran)."""
    speed = report.removal.tokens_per_second if report is not None and report.removal is not None else None
    return seconds_at(soft_cost(result, methods, QUICK_SOFT, steps)["tokens"], speed)


@user_errors
def soft_cost_note(
    result: Attribution | None, methods: list[str], choice: str, step: float | None, report: Any
) -> FaithfulnessView:
    """What pi-Soft will cost with the current choice, shown before it starts; never runs the model."""
    if not isinstance(result, Attribution) or not result.num_steps:  # none yet, or an image result (no pi-Soft)
        return FaithfulnessView(cost="")
    steps = soft_steps(result, choice, step)
    chosen = [m for m in (methods or []) if m in result.methods]
    if steps is False or not chosen:
        return FaithfulnessView(cost="π-Soft: off." if steps is False else "")
    cost = soft_cost(result, chosen, QUICK_SOFT, steps)
    seconds = _soft_seconds(result, chosen, steps, report)
    eta = f", about {seconds:.0f} s at the speed measured for the removal curves" if seconds else ""
    passes = cost["forwards"] // cost["steps"]
    plural = "s" if cost["steps"] > 1 else ""
    return FaithfulnessView(
        cost=f"π-Soft cost: {cost['steps']} step{plural} × {passes} forward passes over {cost['tokens']:,} "
        f"positions{eta}."
    )


def _measured(result: Attribution, chosen: list[str], report: FaithfulnessReport, steps: Any, done: bool) -> str:
    seconds = ", ".join(f"{part} {s:.1f} s" for part, s in report.seconds.items())
    if done:
        return (
            f"Measured on {result.num_steps} answer tokens for {', '.join(map(markdown_text, chosen))} (random "
            f"baseline added): {seconds}."
        )
    eta = _soft_seconds(result, chosen, steps, report)  # kept short: the progress text is drawn over this line
    return f"Removal curves ready ({seconds}); π-Soft running" + (f", ~{eta:.0f} s" if eta else "") + "…"


def _image_inputs(result: Any) -> tuple[Any, dict]:
    """The vision model and the prompt's image inputs of an image-tab result (its question and image encoded again,
    as asked)."""
    from explainer.models.vision import encode_image_prompt

    attr, bundle = result.attr, models.get_vl_bundle()
    encoded = encode_image_prompt(
        bundle, result.image, result.question, max_new_tokens=max(attr.num_steps, 1),
        max_image_tokens=result.max_image_tokens,
    )  # fmt: skip
    if encoded.input_ids[0].tolist() != attr.prompt_token_ids:
        raise InputError("The image or question no longer match the answer shown: ask again, then measure.")
    return bundle, encoded.prefill_inputs


@user_errors
async def faithfulness(
    result: Any,
    methods: list[str],
    metric: str,
    soft_choice: str = SOFT_CHOICES[0],
    step: float | None = None,
    rank: str = RANKED[0],
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> Any:
    """Measure MIF/LIF/SRG, then pi-Soft, for the selected methods of the session's result; removal curves are shown
    as soon as they are ready. An image-tab result (`image_tab.ImageResult`) ranks its image tokens (`rank`:
    "image" or "image+question"), and pi-Soft, measured on text prompts only, is skipped.

    Yields:
        `FaithfulnessView`s with the `SHOWN` fields: the status note first, then the report as it grows.
    """
    request = faithfulness_request(result, methods, soft_choice, step, rank)  # `gpu_time` sizes the call from it too
    attr, chosen = measured(result), list(request.methods)
    if is_image_result(result):
        bundle, image_inputs = _image_inputs(result)
        request = dataclasses.replace(request, image_inputs=image_inputs)
    else:
        bundle = models.get_bundle()

    def start(cancel: Any) -> Any:
        return stream_faithfulness(
            bundle, attr, request, progress=lambda f, message: progress(f, desc=message), cancel=cancel
        )

    async with aclosing(run_stream(bundle, start, "Faithfulness produced no result.")) as updates:
        async for update in updates:
            report = update.item
            if report is None:  # the note before the first report (the waiting note, if any), or a failure recorded
                note = update.note and (update.note if update.request.phase is Phase.WAITING else MEASURING)
                yield FaithfulnessView(status=note or KEEP, request=update.request)
                continue
            done = update.request.phase is Phase.DONE or report.status == "done" or request.soft is None
            status = _measured(attr, chosen, report, request.steps, done)
            view = render_faithfulness(report, metric)
            yield dataclasses.replace(view, status=status, report=report, request=update.request)


@user_errors
def after_faithfulness(request: RequestState | None) -> FaithfulnessView:
    """Run after every faithfulness request (Gradio runs it once a cancelled request has stopped): a measurement
    that did not finish says so instead of keeping its last progress line."""
    if not isinstance(request, RequestState) or not request.in_flight:
        return FaithfulnessView()
    why = "failed with the message shown" if request.error else "was cancelled"
    return FaithfulnessView(
        status=f"Stopped: the measurement {why}; the model is free again.", request=request.settled()
    )


def create_ui(image: bool = False) -> Components:
    """The faithfulness accordion's components (call inside the text tab, or the image tab with `image`: its image
    tokens are ranked, optionally with the question's, and pi-Soft is left out)."""
    c = Components()
    with gr.Accordion("Faithfulness", open=False):
        gr.Markdown(IMAGE_NOTE if image else NOTE)
        c["report"] = gr.State(None)
        c["request"] = gr.State(RequestState())
        with gr.Row():
            c["measure"] = gr.Button("Measure faithfulness")
            c["cancel"] = gr.Button("Cancel", variant="stop")
            c["metric"] = gr.Dropdown(list(REMOVAL_METRIC_KEYS), value="mean logit", label="Removal curve metric")
            soft = SOFT_CHOICES[2] if image else SOFT_CHOICES[0]
            c["soft_choice"] = gr.Radio(list(SOFT_CHOICES), value=soft, label="π-Soft over", visible=not image)
            c["rank"] = gr.Radio(list(RANKED), value=RANKED[0], label="Tokens ranked and removed", visible=image)
        c["cost"] = gr.Markdown()
        c["status"] = gr.Markdown()
        with gr.Row():
            c["removal"] = gr.Plot(label="Token removal: MIF / LIF", scale=3)
            with gr.Column(scale=1, min_width=240, visible=not image):  # Sources explains text prompts only
                c["lds"] = gr.Plot(label="LDS on this answer")
                c["lds_note"] = gr.Markdown()
        c["soft"] = gr.Plot(label="π-Soft-NS / π-Soft-NC", visible=not image)  # text prompts only
        c["table"] = gr.Dataframe(
            headers=TABLE_HEADERS,
            datatype=["str"] + ["number"] * (len(TABLE_HEADERS) - 1),
            interactive=False,
            label="Summary",
        )
    return c


def create_event_handlers(c: Components, result: Any, methods: Any, step: Any, prefix: str = "") -> None:
    """Wire the panel to the text tab's result State, methods checkboxes and step slider."""
    event = c["measure"].click(
        **c.bind(faithfulness, SHOWN, gpu=True, duration=gpu_time.faithfulness_seconds, gate=admission.MODEL),
        inputs=[result, methods, c["metric"], c["soft_choice"], step, c["rank"]],
        api_name=f"{prefix or 'page_'}faithfulness",  # private: the public /faithfulness is ui/api.py's
        show_progress_on=c["status"],  # one progress line; the removal curves stay readable while pi-Soft runs
    )
    c["cancel"].click(None, cancels=[event])  # the status is set after the request stops (see the text tab)
    turn = in_turn(f"{prefix}faithfulness_figures")  # the report's figures, drawn in the order asked
    settle(
        event,
        **c.bind(after_faithfulness, SHOWN), inputs=[c["request"]], api_name=f"{prefix}after_faithfulness",
        show_progress="hidden", **turn,
    )  # fmt: skip
    gr.on(
        triggers=[c["soft_choice"].input, step.release, methods.input, result.change],
        **c.bind(soft_cost_note, ("cost",)),
        inputs=[result, methods, c["soft_choice"], step, c["report"]],
        api_name=f"{prefix}soft_cost_note",
        show_progress="hidden",
        queue=False,
        **FOLLOWS_STEP,
    )
    c["metric"].input(
        **c.bind(render_faithfulness, FIGURES), inputs=c("report", "metric"), api_name=f"{prefix}render_faithfulness",
        show_progress="hidden", **turn,
    )  # fmt: skip
