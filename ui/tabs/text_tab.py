"""The text tab: a prompt (and optionally an answer to explain), the answer streaming token by token, and for the
answer token on the step slider (or a span of them) a heatmap per method over the prompt; downloads, and opening a
saved result. The result lives in the visitor's `gr.State` as a plain-CPU `Attribution`: moving a slider or ticking
a box re-renders it without running the model.
"""

from __future__ import annotations

import dataclasses
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import gradio as gr

from explainer.result.attribution import Attribution
from explainer.result.sinks import sink_positions
from explainer.result.spans import GRANULARITIES
from explainer.result.steps import clamp_step
from visuals import answer_html, side_by_side_html, top_tokens_rows
from visuals.export import export_filename, load_result, png_bytes, result_json
from visuals.granularity import span_side_by_side_html, top_sentences_html
from visuals.png import view_png
from visuals.report import report_html

from .. import gpu_time, models
from ..downloads import download, exported_methods, has_steps, no_file
from ..events import KEEP, Components, in_turn, settle
from ..guards import admission, inputs, uploads
from ..guards.errors import user_errors
from ..guards.markup import markdown_text
from ..options import method_choices, offered_choices
from ..page import VIEWS_CLASS, VIEWS_ID, busy_on_click, ready_after
from ..panels import estimates
from ..requests import text_request
from ..stream import FOLLOWS_STEP, Phase, RequestState, explain_updates, finished, status_line, step_slider, stopped
from . import examples

TOP_K = 5  # rows per method in the top-tokens table
TOP_SENTENCES = 3  # sentences per method under a span or word/sentence view
TABLE_HEADERS = ["method", "rank", "token", "position", "z"]
EMPTY_HEATMAP = (
    "<p>Type a prompt and press <b>Generate</b>: a heatmap over the prompt appears for every answer token.</p>"
)


@dataclass
class TextView:
    """What a text-tab handler changes, one field per component of `create_ui`; `KEEP` leaves a component as it is."""

    answer: Any = KEEP  # the answer strip (HTML)
    heatmap: Any = KEEP  # heatmap panels, and the top sentences under a span or word/sentence units (HTML)
    table: Any = KEEP  # top-token rows (or a Dataframe update)
    step: Any = KEEP  # step slider update
    span_end: Any = KEEP  # span-end slider update
    status: Any = KEEP  # the status line
    result: Any = KEEP  # State: the Attribution shown
    request: Any = KEEP  # State: the RequestState of the newest explain request
    methods: Any = KEEP  # methods checkbox update (a reopened result ticks its own)
    json_file: Any = KEEP
    report_file: Any = KEEP
    png_file: Any = KEEP
    prompt: Any = KEEP  # the prompt box (an example fills it)


VIEWS = ("answer", "heatmap", "table")  # what `render` draws for the step(s) on the sliders; a new view goes here
SHOWN = VIEWS + ("step", "span_end", "status", "result", "request")  # a new or reopened result
SPAN = ("step", "span_end", "table")
FILES = ("json_file", "report_file", "png_file")
VIEWS_IN_TURN = in_turn("text_views")  # every event that draws the views (but the gated requests), in arrival order
FILES_IN_TURN = in_turn("text_files")  # and every one that fills the downloads
EXAMPLE = SHOWN + ("methods", "prompt")  # an example's saved result, shown


def _top_rows(
    attr: Attribution, methods: list[str], step: int | None, user_only: bool, hide_sinks: bool = False
) -> list[list]:
    return [[m, *row] for m in methods for row in top_tokens_rows(attr, m, step, TOP_K, user_only, hide_sinks)]


@user_errors
def render(
    result: Attribution | None,
    methods: list[str],
    step: float | None,
    show_all: bool,
    span: bool = False,
    span_end: float | None = None,
    granularity: str = "token",
    hide_sinks: bool = False,
) -> TextView:
    """The views (answer, heatmaps, top-token rows) of one step, or a span of steps, of a stored result; never runs
    the model.

    Args:
        result: the session's result, or None before the first generation.
        methods: methods to show, one panel each.
        step: 1-based step from the slider (None: the newest); with `span`, the span's first or last token.
        show_all: show every prompt token with z over all of them, instead of only the user's text re-normalised.
        span: explain the answer tokens from `step` to `span_end` (either order) with the mean of their z-scores.
        span_end: 1-based other end of the span (None: `step`).
        granularity: prompt units, "token", "word" or "sentence".
        hide_sinks: leave the result's attention sinks out of the heatmaps' z-scores and colours (hatched), the
            top tokens and the top sentences.

    Returns:
        The `VIEWS` fields. A single step at token units is `side_by_side_html`; a span or word/sentence units show
        `span_side_by_side_html` with each method's top sentences below, and top-token rows only for a single step.
    """
    granularity = inputs.granularity(granularity)
    if result is None:
        return TextView(answer="", heatmap=EMPTY_HEATMAP, table=[])
    methods, user_only, index = list(methods or []), not show_all, inputs.step_index(step)
    if not span and granularity == "token":
        heatmap = side_by_side_html(result, methods, index, user_only, hide_sinks=bool(hide_sinks))
        rows = _top_rows(result, methods, index, user_only, bool(hide_sinks))
        return TextView(answer=answer_html(result, index), heatmap=heatmap, table=rows)
    first = last = clamp_step(index, result.num_steps)
    if span and span_end is not None and first is not None:
        last = clamp_step(inputs.step_index(span_end), result.num_steps)
        first, last = min(first, last), max(first, last)
    hide = bool(hide_sinks)
    heatmap = span_side_by_side_html(result, methods, first, last, granularity, user_only, hide_sinks=hide)
    heatmap += top_sentences_html(result, methods, first, last, TOP_SENTENCES, user_only, hide_sinks=hide)
    rows = _top_rows(result, methods, first, user_only, hide) if first == last else []
    return TextView(answer=answer_html(result, first, last), heatmap=heatmap, table=rows)


@user_errors
def render_sinks(
    result: Attribution | None,
    methods: list[str],
    step: float | None,
    show_all: bool,
    span: bool = False,
    span_end: float | None = None,
    granularity: str = "token",
    hide_sinks: bool = False,
) -> TextView:
    """Once an answer is complete (or a result opened) its sinks are known: with "Leave out attention sinks" ticked
    and sinks found, `render` again; otherwise nothing changes (so no late redraw races the visitor's next click)."""
    if not hide_sinks or not isinstance(result, Attribution) or not sink_positions(result):
        return TextView()
    return render(result, methods, step, show_all, span, span_end, granularity, hide_sinks)


def result_view(
    attr: Attribution, methods: list[str], show_all: bool, live: bool, span: bool, granularity: str
) -> TextView:
    """The `SHOWN` fields of a (possibly still growing) result, for the handlers of the text tab and its contrast
    step: the views, the status and the sliders (`stream.step_slider`; a finished span covers the whole answer)."""
    step = step_slider(attr, live, 1 if span and not live else None)
    end = step_slider(attr, live, max(attr.num_steps, 1))
    view = render(attr, methods, step["value"], show_all, span, attr.num_steps, granularity)
    return dataclasses.replace(view, step=step, span_end=end, status=status_line(attr, live), result=attr)


@user_errors
async def explain(
    prompt: str,
    methods: list[str],
    max_new_tokens: float,
    chat_template: bool,
    show_all: bool,
    answer: str | None = None,
    span: bool = False,
    granularity: str = "token",
    *options: Any,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> Any:
    """Generate an answer (or explain the given `answer`, teacher-forced) and its attributions, yielding the views
    as tokens arrive. `span` and `granularity` choose the view as in `render`; `options` are the values of the
    "Method options" widgets. The request is `requests.text_request` of these arguments, as `gpu_time.text_seconds`
    reads it.

    Yields:
        `TextView`s with the `SHOWN` fields: first the status note alone, then every update, the sliders locked to
        the newest step until the last one releases them.
    """
    asked = (prompt, methods, max_new_tokens, chat_template, show_all, answer, span, granularity)
    request = text_request(*asked, *options)
    updates = explain_updates(models.get_bundle(), request, progress)
    methods, span = list(request.method_names), bool(span)
    async with aclosing(updates):  # a visitor who leaves closes the handler, and with it the work, at once
        async for update in updates:
            if update.item is None:
                yield TextView(status=update.note or KEEP, request=update.request)
            else:
                live = update.request.phase is not Phase.DONE and not finished(update.item)
                view = result_view(update.item, methods, show_all, live, span, request.unit)
                yield dataclasses.replace(view, request=update.request)


@user_errors
def after_explain(
    result: Attribution | None,
    request: RequestState | None,
    methods: list[str] | None = None,
    show_all: bool = False,
    span: bool = False,
    granularity: str = "token",
) -> TextView:
    """Run after every explain request, finished, failed or cancelled (Gradio runs it once a cancelled request has
    stopped, so no late update overwrites it). A request still in flight in `request` stopped early: the status
    says where and why, and a partial answer is shown as a finished one (free sliders, opened on its last content
    token; `methods`, `show_all`, `span` and `granularity` choose the view as in `render`). Returns the `SHOWN`
    fields it changes."""
    stop = stopped(request, result)
    if stop is None:
        return TextView()
    if not stop.partial:
        return TextView(status=stop.status or KEEP, request=stop.request)
    view = result_view(result, list(methods or []), show_all, False, bool(span), inputs.granularity(granularity))
    return dataclasses.replace(view, status=stop.status, request=stop.request)


@user_errors
def span_controls(result: Attribution | None, span: bool) -> TextView:
    """Ticking "Explain a span" shows the span-end slider and sets the span to the whole answer; the top-token
    table (one step's) makes way for the top sentences. Returns the `SPAN` fields."""
    span = bool(span)
    table = gr.update(visible=not span)
    if not isinstance(result, Attribution) or result.num_steps < 2:
        return TextView(span_end=gr.update(visible=span), table=table)
    steps = result.num_steps
    end = gr.update(visible=span, minimum=1, maximum=steps, value=steps, interactive=True)
    return TextView(step=gr.update(value=1) if span else KEEP, span_end=end, table=table)


@user_errors
def open_saved(upload: Any, show_all: bool, span: bool, granularity: str) -> TextView:
    """Load a result saved as JSON ("Open a saved result") into the session and show it with its methods ticked;
    never runs the model. `upload` is the File's raw payload (the event runs with `preprocess=False`): only a file
    uploaded to this app is opened (`uploads.uploaded_path`). Returns the `SHOWN` fields and `methods`."""
    if not upload:
        return TextView()
    path = uploads.uploaded_path(upload)
    attr = load_result(path)
    choices = offered_choices()
    methods = list(attr.methods)
    box = gr.update(choices=choices + [m for m in methods if m not in choices], value=methods)
    given = " of a given answer (teacher-forced)" if attr.meta.get("answer") == "given" else ""
    name = upload.get("orig_name") if isinstance(upload, dict) else None  # the visitor's file name
    shown = ", ".join(markdown_text(m) for m in methods) or "none"
    status = (
        f"Opened {markdown_text(name if isinstance(name, str) and name else path.name)}: {attr.num_steps} answer "
        f"tokens{given} by {markdown_text(attr.model)}, methods {shown}; no model was run. Move the slider to explain "
        "any token."
    )
    view = result_view(attr, methods, show_all, False, bool(span), inputs.granularity(granularity))
    return dataclasses.replace(view, status=status, request=RequestState(), methods=box)


@user_errors
def open_example(
    index: Any, methods: list[str] | None, show_all: bool, span: bool = False, granularity: str = "token"
) -> TextView:
    """A clicked example (its index; None: the first, for the first page view): its prompt, and its saved result
    shown at once with the ticked methods it has (else the default ones); never runs a model. Returns the `EXAMPLE`
    fields (only the prompt for an example without a saved result)."""
    shown = examples.examples()
    i = 0 if index is None else round(inputs.number(index, "The example"))
    if not 0 <= i < len(shown):
        return TextView()
    attr = examples.saved_result(shown[i])
    if attr is None:
        return TextView(prompt=shown[i]["prompt"])
    chosen = examples.shown_methods(attr, methods, method_choices()[1])
    view = result_view(attr, chosen, show_all, False, bool(span), inputs.granularity(granularity))
    status = examples.saved_status(attr, shown[i]["label"])
    box = gr.update(value=chosen)
    return dataclasses.replace(view, status=status, request=RequestState(), methods=box, prompt=shown[i]["prompt"])


@user_errors
def export_report(result: Attribution | None, methods: list[str], show_all: bool) -> TextView:
    """The "HTML report" download: one self-contained page of the ticked methods with its own step slider; off
    without a result. Never runs the model."""
    if not has_steps(result):
        return TextView(report_file=no_file())
    report = report_html(result, exported_methods(result, methods), user_only=not show_all)
    return TextView(report_file=download(report, export_filename(result, "html", "report")))


@user_errors
def export_files(result: Attribution | None, methods: list[str], show_all: bool) -> TextView:
    """The "JSON" (the CLI's format, every method) and "HTML report" downloads of a new result; off without one."""
    if not has_steps(result):
        return TextView(json_file=no_file(), report_file=no_file())
    json_file = download(result_json(result), export_filename(result, "json"))
    return dataclasses.replace(export_report(result, methods, show_all), json_file=json_file)


@user_errors
def export_view(
    result: Attribution | None,
    methods: list[str],
    step: float | None,
    show_all: bool,
    span: bool = False,
    granularity: str = "token",
) -> TextView:
    """The "PNG of this view" download: the side-by-side heatmaps of the step on the slider. It draws the token view
    of one step, so it is off while a span or word/sentence units are shown."""
    if not has_steps(result) or span or granularity != "token":
        return TextView(png_file=no_file())
    image = view_png(result, list(methods or []), inputs.step_index(step), user_only=not show_all)
    return TextView(png_file=download(png_bytes(image), export_filename(result, "png")))


def clear_downloads() -> TextView:
    """Every download off while a new answer is generated."""
    return TextView(json_file=no_file(), report_file=no_file(), png_file=no_file())


def _controls(c: Components) -> None:
    c["model"] = gr.Markdown("**Model:** loading…")
    c["prompt"] = gr.Textbox(
        label="Prompt", lines=4, max_lines=12, placeholder="Ask a question, or paste a context and ask."
    )
    c["given_answer"] = gr.Textbox(
        label="Answer (optional)",
        lines=1,
        max_lines=6,
        placeholder="Leave empty to generate, or paste an answer to explain it (teacher-forced).",
    )
    with gr.Row():
        c["generate"] = gr.Button("Generate", variant="primary", scale=2, min_width=120, elem_id="text-generate")
        c["cancel"] = gr.Button("Cancel", variant="stop", scale=1, min_width=80)
    c["examples"] = examples.create_ui(examples.examples(), c["prompt"])
    choices, default_methods = method_choices()
    c["methods"] = gr.CheckboxGroup(choices, value=default_methods, label="Attribution methods")
    c["methods_note"] = gr.Markdown(visible=False)  # how to make macs_calibrated's weights, for a model without them
    c["estimate"] = gr.Markdown(estimates.HINT)
    c["max_new"] = gr.Slider(
        *inputs.NEW_TOKENS, value=64, step=1, label="Max new tokens", info="A given answer raises it to fit."
    )
    c["chat_template"] = gr.Checkbox(True, label="Use the chat template")
    c["show_all"] = gr.Checkbox(False, label="Show all tokens (incl. chat template)")
    c["open_file"] = gr.File(label="Open a saved result (.json)", file_types=[".json"], type="filepath", height=110)


def _views(c: Components) -> None:
    c["status"] = gr.Markdown(elem_classes=["xai-status"])  # carries the request's progress bar
    c["answer"] = gr.HTML()
    c["step"] = gr.Slider(
        1, 2, value=1, step=1, interactive=False, label="Generation step (the answer token being explained)"
    )
    c["span_end"] = gr.Slider(
        1, 2, value=1, step=1, interactive=False, visible=False, label="Span end (the span runs from the step above)"
    )
    c["heatmap"] = gr.HTML(EMPTY_HEATMAP)
    with gr.Row(equal_height=True):
        c["span"] = gr.Checkbox(False, label="Explain a span of answer tokens (mean of their z-scores)")
        c["granularity"] = gr.Radio(list(GRANULARITIES), value="token", label="Prompt units")
    c["table"] = gr.Dataframe(
        headers=TABLE_HEADERS,
        datatype=["str", "number", "str", "number", "number"],
        interactive=False,
        label="Top prompt tokens at this step",
    )
    with gr.Row():
        c["json_file"] = gr.DownloadButton("Download JSON", interactive=False, size="sm")
        c["report_file"] = gr.DownloadButton("Download HTML report", interactive=False, size="sm")
        c["png_file"] = gr.DownloadButton("Download PNG of this view", interactive=False, size="sm")


def create_ui() -> Components:
    """The text tab's components (call inside its `gr.Tab`): the controls in a side column and the views beside them,
    the answer, the step slider and the method panels first, so that a 1280×900 screen shows a result at first view
    (`ui/page.py`). `model` is the model line that `demo.load` fills."""
    c = Components()
    c["result"] = gr.State(None)
    c["request"] = gr.State(RequestState())
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            _controls(c)
        with gr.Column(scale=5, min_width=560, elem_id=VIEWS_ID, elem_classes=[VIEWS_CLASS]):
            _views(c)
    return c


def then_export(c: Components, event: Any, files_api: str | None, view_api: str) -> None:
    """After `event`: the new result's JSON and report files (unless `files_api` is None), then this view's PNG;
    every event that shows a result (a request, an opened file, an example, the first view) chains it."""
    hidden = {"show_progress": "hidden", **FILES_IN_TURN}
    if files_api is not None:
        files = c("result", "methods", "show_all")
        event = event.then(**c.bind(export_files, FILES), inputs=files, api_name=files_api, **hidden)
    png = c("result", "methods", "step", "show_all", "span", "granularity")
    event.then(**c.bind(export_view, FILES), inputs=png, api_name=view_api, **hidden, **FOLLOWS_STEP)


def create_event_handlers(c: Components, option_widgets: list[Any]) -> None:
    """Wire the text tab's events (and its time estimates); `option_widgets` are the "Method options" widgets, and
    `c["hide_sinks"]` the shared "Leave out attention sinks" checkbox (`options.sinks_toggle`)."""
    asked = c("prompt", "methods", "max_new", "chat_template", "show_all", "given_answer", "span", "granularity")
    busy_on_click(c["generate"], "Generating…", "generate")  # first: see busy_on_click
    explain_event = c["generate"].click(
        **c.bind(explain, SHOWN, gpu=True, duration=gpu_time.text_seconds, gate=admission.TEXT),
        inputs=asked + option_widgets,
        api_name="page_explain",  # private: the public /explain is ui/api.py's
        show_progress_on=c["status"],  # one progress line; the answer and views stay readable while they stream
    )
    ready_after(explain_event, c["generate"], "generate")
    hidden = {"show_progress": "hidden"}
    c["generate"].click(**c.bind(clear_downloads, FILES), queue=False, api_name="clear_downloads", **hidden)
    follows = {**hidden, **FOLLOWS_STEP}  # events that read the step sliders, which a new request may have shrunk
    turn = {**hidden, **VIEWS_IN_TURN}  # events that draw the views
    drawn = {**follows, **VIEWS_IN_TURN}  # ... and read the step sliders
    view = c("result", "methods", "step", "show_all", "span", "span_end", "granularity", "hide_sinks")
    triggers = ["step", "show_all", "methods", "span_end", "granularity", "hide_sinks"]
    rendered = gr.on(
        triggers=[c[name].input for name in triggers], **c.bind(render, VIEWS), inputs=view, api_name="render",
        trigger_mode="always_last", **drawn,
    )  # fmt: skip
    then_export(c, rendered, None, "export_view")
    spanned = c["span"].input(**c.bind(span_controls, SPAN), inputs=c("result", "span"), api_name="span", **turn)
    spanned = spanned.then(**c.bind(render, VIEWS), inputs=view, api_name="render_span", **drawn)
    then_export(c, spanned, None, "export_span_view")
    gr.on(
        triggers=[c["show_all"].input, c["methods"].input], **c.bind(export_report, FILES),
        inputs=c("result", "methods", "show_all"), api_name="export_report", trigger_mode="always_last",
        **hidden, **FILES_IN_TURN,
    )  # fmt: skip
    # Cancel only cancels; what a stopped request shows is set by `after_explain`, which Gradio runs once the
    # cancelled request has stopped (a handler of the Cancel click itself would race with the request's last update).
    c["cancel"].click(None, cancels=[explain_event])
    after = c("result", "request", "methods", "show_all", "span", "granularity")
    settled = settle(explain_event, **c.bind(after_explain, SHOWN), inputs=after, api_name="after_explain", **turn)
    then_export(c, settled, "export_files", "export_view_after_explain")
    # the sinks are known once the answer is complete: drawn again if "Leave out attention sinks" is ticked
    settled.then(**c.bind(render_sinks, VIEWS), inputs=view, api_name="render_after_explain", **drawn)
    # the model loads with the first request: its line then names the precision and the prompt limit
    explain_event.then(
        models.model_info, outputs=c["model"], api_name="model_info_after_explain", api_visibility="private", **hidden
    )
    opened = c["open_file"].upload(
        **c.bind(open_saved, SHOWN + ("methods",)), inputs=c("open_file", "show_all", "span", "granularity"),
        api_name="open_saved", **VIEWS_IN_TURN,
    )  # fmt: skip
    then_export(c, opened, "export_files_after_open", "export_view_after_open")
    opened.then(**c.bind(render_sinks, VIEWS), inputs=view, api_name="render_after_open", **drawn)
    asked = c("examples", "methods", "show_all", "span", "granularity")
    picked = c["examples"].click(
        **c.bind(open_example, EXAMPLE), inputs=asked, api_name="open_example", **VIEWS_IN_TURN)  # fmt: skip
    then_export(c, picked, "export_files_after_example", "export_view_after_example")
    picked.then(**c.bind(render_sinks, VIEWS), inputs=view, api_name="render_after_example", **drawn)
    estimates.create_event_handlers(c, option_widgets, explain_event)
