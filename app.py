"""Gradio UI: type a prompt, watch the answer stream, and see for each answer token which prompt tokens it drew on.

UI only: this file reads widgets, calls `explainer`, renders with `visuals` and returns outputs. The model is loaded
once per process by `get_bundle()` and shared read-only; each user's result lives in `gr.State` as a plain-CPU
`Attribution`, so moving the step slider or toggling views re-renders without running the model again.

Run with `python app.py`; `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT` pick host and port, `EXPLAINER_MODEL` a hub
id or local folder instead of the embedded default model.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import gradio as gr

from explainer import METHODS, ExplainerError, available_methods, load_model, stream_explain
from explainer.estimate import calibrate, estimate
from explainer.explain import MAX_NEW_TOKENS_LIMIT
from explainer.faithfulness import (
    QUICK_SOFT,
    REMOVAL_METRICS,
    FaithfulnessReport,
    soft_cost,
    stream_faithfulness,
)
from explainer.hardware import on_gpu
from explainer.methods import method_options
from explainer.models import default_model_ids, parse_device_map
from explainer.result import Attribution
from explainer.session import CancelToken, WorkerStream, model_lock
from explainer.spans import GRANULARITIES
from explainer.vision import DEFAULT_MAX_IMAGE_TOKENS, load_image
from visuals import answer_html, overlay_grid, side_by_side_html, top_tokens_rows
from visuals.curves import TABLE_HEADERS as FAITHFULNESS_HEADERS
from visuals.curves import faithfulness_rows, removal_figure, soft_figure
from visuals.export import DownloadFolder, export_filename, load_result, png_bytes, result_json
from visuals.granularity import span_side_by_side_html, top_sentences_html
from visuals.overlay import gif_bytes
from visuals.png import view_png
from visuals.report import report_html

# EXPLAINER_MODEL / EXPLAINER_VLM, else Hub models when the Hub answers (asked once, here), else None: the embedded
# model and no image tab. Loaded on first use.
MODEL_ID, VLM_ID = default_model_ids()
EXAMPLES_PATH = Path(__file__).resolve().parent / "assets" / "examples.json"
IMAGES_DIR = Path(__file__).resolve().parent / "assets" / "images"
DEFAULT_QUESTION = "What is in the image?"
CONTOUR_TOP_PERCENT = 10
_NO_VLM = (
    "**Image questions are off:** they need a vision-language model. The default, Qwen/Qwen2.5-VL-3B-Instruct, "
    "comes from the Hugging Face Hub and is used only when `EXPLAINER_VLM` is unset and the Hub is reachable. "
    "Restart the app with `EXPLAINER_VLM=<hub id or local folder>`, e.g. "
    "`EXPLAINER_VLM=Qwen/Qwen2.5-VL-3B-Instruct python app.py` (any Qwen2.5-VL or Qwen2-VL size)."
)
_EMPTY_IMAGE = "<p>Upload an image, ask a question and press <b>Ask</b>: the question's tokens appear here.</p>"
DEFAULT_METHODS = ["macs", "rollout"]  # side by side on first use; the slower methods are opt-in, with time estimates
TOP_K = 5  # rows per method in the top-tokens table
TOP_SENTENCES = 3  # sentences per method under a span or word/sentence view
TABLE_HEADERS = ["method", "rank", "token", "position", "z"]
_EMPTY_HEATMAP = (
    "<p>Type a prompt and press <b>Generate</b>: a heatmap over the prompt appears for every answer token.</p>"
)

UPDATE_SECONDS = 0.25  # at most ~4 streamed updates per second; the final state is always sent
# Slider bounds, (min, max); handlers refuse values outside them with a message (API callers can send anything).
NEW_TOKENS = (1, 256)
IMAGE_NEW_TOKENS = (1, 128)
IMAGE_TOKENS = (16, 1024)
_load_lock = threading.Lock()
# Gradio's prose style draws borders around every table cell and squeezes narrow columns: the top-sentence tables
# keep their rank and score on one line and no grid.
_CSS = (
    ".xai-top table,.xai-top tr,.xai-top th,.xai-top td{border:none !important;background:none}"
    ".xai-top tbody tr{border-top:1px solid #d0d7de !important}.xai-top{margin-top:8px}"
    ".xai-top td:nth-child(-n+2),.xai-top th:nth-child(-n+2){white-space:nowrap;width:1%}"
)


@functools.cache
def _load(model_id: str | None) -> Any:
    # EXPLAINER_DEVICE_MAP=auto spreads a model too big for one GPU over all of them (accelerate's dispatch)
    return load_model(model_id, device_map=parse_device_map(os.environ.get("EXPLAINER_DEVICE_MAP")))


def get_bundle() -> Any:
    """The process-wide model bundle: loaded on first use (serialised by a lock), then shared read-only."""
    with _load_lock:
        return _load(MODEL_ID)


def model_info() -> str:
    """Markdown line naming the loaded model; loads it on the first page visit."""
    try:
        bundle = get_bundle()
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    return f"**Model:** `{bundle.name}` · prompts up to {bundle.max_prompt_tokens} tokens"


def _number(value: Any, label: str) -> float:
    """A widget's value as a finite number, or a `gr.Error` naming the widget."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise gr.Error(f"{label} must be a number, got {value!r:.40}.") from None
    if not math.isfinite(x):
        raise gr.Error(f"{label} must be a finite number, got {value!r:.40}.")
    return x


def _whole(value: Any, label: str, bounds: tuple[int, int]) -> int:
    """A slider's value as a whole number within its bounds, or a `gr.Error` saying what is allowed."""
    x = _number(value, label)
    lo, hi = bounds
    if not lo <= x <= hi:
        raise gr.Error(f"{label} must lie between {lo} and {hi}, got {value!r:.40}.")
    return round(x)


def _step_index(step: Any) -> int | None:
    """0-based step from the 1-based step slider (None: the newest); the views clamp it to the steps there are."""
    return None if step is None else round(_number(step, "The generation step")) - 1


def option_inputs() -> list[tuple[str, str, Any]]:
    """(method, option, component) for every option of every registered method, one row per method, generated from
    the methods' config dataclasses: a checkbox for true/false, a number box for numbers, a menu for a fixed set of
    words. Call inside a Blocks context."""
    out = []
    for method in available_methods():
        with gr.Row(equal_height=True):
            gr.Markdown(f"**{method}**", min_height=0)
            for opt in method_options(method):
                label, kw = f"{method}: {opt.name}", {"min_width": 180}
                if opt.type is bool:
                    component = gr.Checkbox(opt.default, label=label, show_label=True, container=True, **kw)
                elif opt.type in (int, float):
                    component = gr.Number(opt.default, label=label, precision=0 if opt.type is int else None, **kw)
                elif opt.choices:
                    component = gr.Dropdown(list(opt.choices), value=opt.default, label=label, **kw)
                else:
                    component = gr.Textbox(str(opt.default), label=label, **kw)
                out.append((method, opt.name, component))
    return out


def chosen_options(methods: list[str], values: tuple) -> dict[str, dict[str, Any]]:
    """{method: {option: value}} of the selected methods from the option widgets' values (in `OPTION_KEYS` order); the
    library validates them and says what is wrong."""
    out: dict[str, dict[str, Any]] = {}
    for (method, name), value in zip(OPTION_KEYS, values):
        if method in methods and value is not None:
            out.setdefault(method, {})[name] = value
    return out


async def follow(stream: WorkerStream) -> AsyncIterator[Any]:
    """The newest update of a library stream, at most every `UPDATE_SECONDS`, until it ends.

    The work runs in the library's worker thread, which holds the model. When the visitor cancels or closes the tab,
    Gradio cancels this coroutine: the `finally` cancels the work, which stops within one forward pass and only then
    releases the model, so the next visitor's request starts on a quiet model.
    """

    def take() -> tuple[str, Any]:
        try:
            return "item", stream.latest(UPDATE_SECONDS)
        except StopIteration:
            return "end", None

    try:
        last = 0.0
        while True:
            kind, item = await anyio.to_thread.run_sync(take, abandon_on_cancel=True)
            if kind == "end":
                return
            if item is None:
                continue
            yield item
            wait = UPDATE_SECONDS - (time.monotonic() - last)
            last = time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)  # updates arriving meanwhile are merged into the newest one
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    finally:
        stream.cancel("The visitor cancelled the request or left the page.")


def _waiting_note(bundle: Any) -> str | None:
    lock = model_lock(bundle.model)
    if not lock.locked():
        return None
    ahead = lock.waiting + 1
    return f"{_WAITING}: {ahead} request{'s' if ahead > 1 else ''} ahead (a cancelled one stops first)…"


def _granularity(value: Any) -> str:
    if value not in GRANULARITIES:
        raise gr.Error(f"Prompt units must be one of {', '.join(GRANULARITIES)}, got {value!r:.40}.")
    return value


def render(
    attr: Attribution | None,
    methods: list[str],
    step: float | None,
    show_all: bool,
    span: bool = False,
    span_end: float | None = None,
    granularity: str = "token",
) -> tuple[str, str, list]:
    """Answer, heatmap panels and top-token rows for one step (or a span of steps) of a stored result; never runs
    the model.

    Args:
        attr: the session's result, or None before the first generation.
        methods: methods to show, one panel each.
        step: 1-based step from the slider (None: the newest); with `span`, the span's first or last token.
        show_all: show every prompt token with z over all of them, instead of only the user's text re-normalised.
        span: explain the answer tokens from `step` to `span_end` (either order) with the mean of their z-scores.
        span_end: 1-based other end of the span (None: `step`).
        granularity: prompt units, "token", "word" or "sentence".

    Returns:
        (answer HTML, heatmap HTML, top-token rows). The single-step token view is `side_by_side_html`; a span or
        word/sentence units show `span_side_by_side_html` with each method's top sentences below, and top-token
        rows only for a single step.
    """
    granularity = _granularity(granularity or "token")
    if attr is None:
        return "", _EMPTY_HEATMAP, []
    methods = list(methods or [])
    index = _step_index(step)
    user_only = not show_all
    if not span and granularity == "token":
        rows = [[m, *row] for m in methods for row in top_tokens_rows(attr, m, index, TOP_K, user_only)]
        return answer_html(attr, index), side_by_side_html(attr, methods, index, user_only), rows
    k = attr.num_steps
    first = last = None
    if k:
        first = min(max(k - 1 if index is None else index, 0), k - 1)
        last = first
        if span and span_end is not None:
            last = min(max(_step_index(span_end), 0), k - 1)
        first, last = min(first, last), max(first, last)
    try:
        heatmap = span_side_by_side_html(attr, methods, first, last, granularity, user_only)
        heatmap += top_sentences_html(attr, methods, first, last, TOP_SENTENCES, user_only)
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    rows = (
        [] if first != last else [[m, *r] for m in methods for r in top_tokens_rows(attr, m, first, TOP_K, user_only)]
    )
    return answer_html(attr, first, last), heatmap, rows


def _status(attr: Attribution, live: bool) -> str:
    given = attr.meta.get("answer") == "given"
    if live:
        return str(attr.meta.get("status") or f"Generating… {attr.num_steps} tokens")
    timings = ", ".join(f"{name} {scores.seconds:.2f} s" for name, scores in attr.methods.items())
    what = f"{attr.num_steps} tokens" + (" of the given answer (teacher-forced)" if given else "")
    return f"Done: {what}. Time per method: {timings or 'n/a'}. Move the slider to explain any token."


def _sliders(attr: Attribution, live: bool, span: bool) -> tuple[dict, dict]:
    """Updates of the step and span-end sliders: locked to the newest step while live; a finished span covers the
    whole answer."""
    steps = max(attr.num_steps, 1)
    free = not live and steps > 1
    # gradio needs maximum > minimum; with one step the sliders stay locked (the views clamp step 2 to 1 anyway)
    step = gr.update(minimum=1, maximum=max(steps, 2), value=1 if span and free else steps, interactive=free)
    end = gr.update(minimum=1, maximum=max(steps, 2), value=steps, interactive=free)
    return step, end


def _outputs(
    attr: Attribution, methods: list[str], show_all: bool, live: bool, span: bool = False, granularity: str = "token"
) -> tuple:
    step, end = _sliders(attr, live, span)
    first = step["value"]
    answer, heatmap, rows = render(attr, methods, first, show_all, span, attr.num_steps, granularity)
    return answer, heatmap, rows, step, end, _status(attr, live), attr


def _answer_text(answer: Any) -> str | None:
    """The answer box's text, or None to generate (empty or whitespace only, as the library reads it)."""
    if answer is None:
        return None
    if not isinstance(answer, str):
        raise gr.Error(f"The answer must be text, got {type(answer).__name__}.")
    return answer if answer.strip() else None


def _answer_budget(answer: str | None, max_new_tokens: int) -> int:
    """max_new_tokens for a request: a given answer raises it to fit, up to the library's limit.

    Byte-level BPE and SentencePiece (byte fallback) tokenizers make at most one token per UTF-8 byte, plus one
    prefix-space token, so that many fit; the library explains exactly the answer's tokens, and an answer that still
    does not fit gets its InputError.
    """
    if answer is None:
        return max_new_tokens
    return min(max(max_new_tokens, len(answer.encode("utf-8")) + 1), MAX_NEW_TOKENS_LIMIT)


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
) -> AsyncIterator[tuple]:
    """Generate an answer (or explain the given `answer`, teacher-forced) and its attributions, yielding the
    rendered views as tokens arrive. `span` and `granularity` choose the view as in `render`; `options` are the
    values of the "Method options" widgets.

    Yields:
        (answer HTML, heatmap HTML, top-token rows, step-slider update, span-end-slider update, status text,
        Attribution for the State); the sliders are locked to the newest step while generating and released on
        the last yield (a span then covers the whole answer).
    """
    methods = list(methods or [])
    if not methods:
        raise gr.Error("Select at least one attribution method.")
    max_new_tokens = _whole(max_new_tokens, "Max new tokens", NEW_TOKENS)
    answer = _answer_text(answer)
    granularity = _granularity(granularity or "token")
    span = bool(span)
    try:
        bundle = get_bundle()
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    # the status line carries the progress bar (`show_progress_on`), so it says something from the start
    yield *[gr.skip()] * 5, _waiting_note(bundle) or _STARTING, gr.skip()
    stream = stream_explain(
        bundle,
        prompt,
        methods=methods,
        max_new_tokens=_answer_budget(answer, max_new_tokens),
        chat_template=bool(chat_template),
        method_options=chosen_options(methods, options),
        progress=lambda fraction, message: progress(fraction, desc=message),  # post-hoc methods (AtMan)
        cancel=CancelToken(),
        answer=answer,
    )
    attr = None
    async for attr in follow(stream):
        yield _outputs(attr, methods, show_all, attr.meta.get("status") != "done", span, granularity)
    if attr is None:
        raise gr.Error("The model produced no tokens. Try another prompt or more new tokens.")
    yield _outputs(attr, methods, show_all, False, span, granularity)


_WAITING = "Waiting for the model"  # how `_waiting_note` starts
_STARTING = "Reading the prompt…"  # the status until the first token (or the waiting note)


def after_explain(attr: Attribution | None, status: str | None = None) -> tuple:
    """Run after every explain request, finished, failed or cancelled (Gradio runs it once the cancelled request
    has stopped, so no late update overwrites it): a stopped answer gets its status and free sliders; a finished
    one is left as its last update showed it; a request stopped before its first token (the status still shows
    the waiting note or `_STARTING`) says so.

    Returns:
        (status text, step-slider update, span-end-slider update), or skips.
    """
    if isinstance(status, str) and status.startswith(_WAITING):
        return (
            "Stopped before it started (cancelled while waiting for the model); the views show the previous result.",
            gr.skip(),
            gr.skip(),
        )
    if status == _STARTING:
        return (
            "Stopped before the first token (cancelled, or failed with the message shown); the views show the "
            "previous result.",
            gr.skip(),
            gr.skip(),
        )
    if not isinstance(attr, Attribution) or attr.meta.get("status") == "done" or not attr.num_steps:
        return gr.skip(), gr.skip(), gr.skip()
    step, end = _sliders(attr, live=False, span=False)
    what = "given answer's tokens" if attr.meta.get("answer") == "given" else "tokens"
    status = (
        f"Stopped after {attr.num_steps} {what} (cancelled, or failed with the message shown); the model is free "
        "again. Move the slider to explain any of them."
    )
    return status, step, end


def span_controls(attr: Attribution | None, span: bool) -> tuple:
    """Ticking "Explain a span" shows the span-end slider and sets the span to the whole answer; the top-token
    table (one step's) makes way for the top sentences.

    Returns:
        (step-slider update, span-end-slider update, table update).
    """
    span = bool(span)
    table = gr.update(visible=not span)
    if not isinstance(attr, Attribution) or attr.num_steps < 2:
        return gr.skip(), gr.update(visible=span), table
    steps = attr.num_steps
    step = gr.update(value=1) if span else gr.skip()
    return step, gr.update(visible=span, minimum=1, maximum=steps, value=steps, interactive=True), table


# Downloads live in one temporary folder per process (removed at exit) that keeps only the newest files; Gradio's own
# cache is cleaned by `delete_cache` below.
KEEP_DOWNLOADS = 32
_DOWNLOADS = DownloadFolder(keep=KEEP_DOWNLOADS)
_NO_FILE = {"value": None, "interactive": False}


def _download(data: str | bytes, filename: str) -> dict:
    """A DownloadButton update serving `data` as `filename`."""
    return gr.update(value=str(_DOWNLOADS.write(data, filename)), interactive=True)


def _exported_methods(attr: Attribution, methods: list[str] | None) -> list[str]:
    """The ticked methods the result has scores for, else all of its methods."""
    return [m for m in (methods or []) if m in attr.methods] or list(attr.methods)


def export_report(attr: Attribution | None, methods: list[str], show_all: bool) -> dict:
    """The "HTML report" download: one self-contained page of the ticked methods with its own step slider (it opens
    at the last step); off without a result. Never runs the model."""
    if not isinstance(attr, Attribution) or not attr.num_steps:
        return gr.update(**_NO_FILE)
    report = report_html(attr, _exported_methods(attr, methods), user_only=not show_all)
    return _download(report, export_filename(attr, "html", "report"))


def export_files(attr: Attribution | None, methods: list[str], show_all: bool) -> tuple[dict, dict]:
    """The "JSON" (the CLI's format, every method) and "HTML report" downloads of a new result.

    Returns:
        (JSON DownloadButton update, HTML report DownloadButton update); both off without a result.
    """
    if not isinstance(attr, Attribution) or not attr.num_steps:
        return gr.update(**_NO_FILE), gr.update(**_NO_FILE)
    return _download(result_json(attr), export_filename(attr, "json")), export_report(attr, methods, show_all)


def export_view(
    attr: Attribution | None,
    methods: list[str],
    step: float | None,
    show_all: bool,
    span: bool = False,
    granularity: str = "token",
) -> dict:
    """The "PNG of this view" download: the side-by-side heatmaps of the step on the slider. It draws the token view
    of one step, so it is off while a span or word/sentence units are shown."""
    if not isinstance(attr, Attribution) or not attr.num_steps or span or granularity != "token":
        return gr.update(**_NO_FILE)
    image = view_png(attr, list(methods or []), _step_index(step), user_only=not show_all)
    return _download(png_bytes(image), export_filename(attr, "png"))


def open_saved(path: Any, show_all: bool, span: bool, granularity: str) -> tuple:
    """Load a result saved as JSON ("Open a saved result") into the session and show it; never runs the model.

    Returns:
        (State, methods-box update with the result's methods ticked, answer HTML, heatmap HTML, top-token rows,
        step-slider update, span-end-slider update, status text).
    """
    if not path:
        return (gr.skip(),) * 8
    try:
        attr = load_result(path)
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    choices, _ = _method_choices()
    methods = list(attr.methods)
    box = gr.update(choices=choices + [m for m in methods if m not in choices], value=methods)
    step, end = _sliders(attr, live=False, span=bool(span))
    answer, heatmap, rows = render(attr, methods, step["value"], show_all, span, attr.num_steps, granularity)
    given = " of a given answer (teacher-forced)" if attr.meta.get("answer") == "given" else ""
    status = (
        f"Opened {Path(path).name}: {attr.num_steps} answer tokens{given} by {attr.model}, methods "
        f"{', '.join(methods) or 'none'}; no model was run. Move the slider to explain any token."
    )
    return attr, box, answer, heatmap, rows, step, end, status


FAITHFULNESS_METRICS = {m.label: m.key for m in REMOVAL_METRICS}
SOFT_CHOICES = ("the step on the slider", "every 5th step", "skip π-Soft")
_FAITHFULNESS_NOTE = (
    "**Removal curves** (MACS paper, App. A.2): 0-20% of your text's tokens are hidden by attention masking, most "
    "(MIF) or least (LIF) influential first by the method's step-averaged score, and the answer is re-generated; "
    "SRG = AUC(LIF) - AUC(MIF), higher is better (for perplexity more negative). **π-Soft** (Grad-ELLM paper, "
    "section 3.1): input embeddings kept with probability calibrated to π; higher is better. Quick setting here: "
    f"{QUICK_SOFT.samples} samples per π, π = {', '.join(str(p) for p in QUICK_SOFT.pis)}, for the step on the "
    "slider or every 5th answer token (the paper uses 15 samples, π step 0.05 and every 5th token: "
    "`python -m explainer faithfulness --soft paper`). The random baseline is dashed. Removal curves appear first "
    "(seconds), π-Soft after; **Cancel** stops the work."
)


def render_faithfulness(report: FaithfulnessReport | None, metric: str) -> tuple[Any, Any, list]:
    """Removal curves of the chosen metric, pi-Soft curves and summary rows of a stored report; never runs the model."""
    if report is None:
        return None, None, []
    removal = removal_figure(report.removal, FAITHFULNESS_METRICS.get(metric, "logit")) if report.removal else None
    soft = soft_figure(report.soft) if report.soft else None
    return removal, soft, faithfulness_rows(report)


def _soft_steps(attr: Attribution, choice: str, step: float | None) -> list[int] | None | bool:
    """0-based steps for pi-Soft: [slider step], None (every 5th) or False (skip)."""
    if choice == SOFT_CHOICES[2]:
        return False
    if choice == SOFT_CHOICES[1]:
        return None
    k = attr.num_steps if step is None else _step_index(step) + 1
    return [min(max(k, 1), attr.num_steps) - 1]


def soft_cost_note(attr: Attribution | None, methods: list[str], choice: str, step: float | None, report: Any) -> str:
    """What pi-Soft will cost with the current choice, shown before it starts; never runs the model."""
    if attr is None or not attr.num_steps:
        return ""
    steps = _soft_steps(attr, choice, step)
    chosen = [m for m in (methods or []) if m in attr.methods]
    if steps is False or not chosen:
        return "π-Soft: off." if steps is False else ""
    cost = soft_cost(attr, chosen, QUICK_SOFT, steps)
    seconds = _soft_seconds(cost, report)
    eta = f", about {seconds:.0f} s at the speed measured for the removal curves" if seconds else ""
    return (
        f"π-Soft cost: {cost['steps']} step{'s' if cost['steps'] > 1 else ''} × {cost['forwards'] // cost['steps']} "
        f"forward passes over {cost['tokens']:,} positions{eta}."
    )


def _soft_seconds(cost: dict[str, int], report: Any) -> float | None:
    """pi-Soft's expected time from its cost and the removal curves' measured speed (None before they ran)."""
    speed = report.removal.tokens_per_second if report is not None and report.removal is not None else 0.0
    return cost["tokens"] / speed if speed else None


async def faithfulness(
    attr: Attribution | None,
    methods: list[str],
    metric: str,
    soft_choice: str = SOFT_CHOICES[0],
    step: float | None = None,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> AsyncIterator[tuple]:
    """Measure MIF/LIF/SRG, then pi-Soft, for the selected methods of the session's result; removal curves are shown
    as soon as they are ready.

    Yields:
        (removal figure, pi-Soft figure, summary rows, status text, report for the State).
    """
    if attr is None or not attr.num_steps:
        raise gr.Error("Generate an answer first: faithfulness is measured on the current result.")
    chosen = [m for m in (methods or []) if m in attr.methods]
    if not chosen:
        raise gr.Error("Select at least one attribution method that was run for this answer, then measure again.")
    steps = _soft_steps(attr, soft_choice, step)
    try:
        bundle = get_bundle()
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    # the status line carries the progress bar (`show_progress_on`), so it says something from the start
    yield gr.skip(), gr.skip(), gr.skip(), _waiting_note(bundle) or "Measuring the removal curves…", gr.skip()
    stream = stream_faithfulness(
        bundle, attr, chosen, soft=None if steps is False else QUICK_SOFT, steps=steps or None,
        progress=lambda f, msg: progress(f, desc=msg), cancel=CancelToken(),
    )  # fmt: skip
    report = None
    async for report in follow(stream):
        seconds = ", ".join(f"{part} {s:.1f} s" for part, s in report.seconds.items())
        done = report.status == "done" or steps is False
        if done:
            status = f"Measured on {attr.num_steps} answer tokens for {', '.join(chosen)} (random baseline added): "
            status += f"{seconds}."
        else:  # kept short: the progress text is drawn over the middle of this line
            eta = _soft_seconds(soft_cost(attr, chosen, QUICK_SOFT, steps), report)
            status = f"Removal curves ready ({seconds}); π-Soft running" + (f", ~{eta:.0f} s" if eta else "") + "…"
        yield *render_faithfulness(report, metric), status, report
    if report is None:
        raise gr.Error("Faithfulness produced no result.")


def after_faithfulness(status: str | None) -> str:
    """Run after every faithfulness request (Gradio runs it once a cancelled request has stopped): a measurement
    that did not finish says so instead of keeping its last progress line."""
    if isinstance(status, str) and status.startswith("Measured on"):
        return gr.skip()
    return "Stopped: the measurement was cancelled (or failed with the message shown); the model is free again."


def _examples() -> list[dict[str, str]]:
    return json.loads(EXAMPLES_PATH.read_text(encoding="utf-8"))


def _method_choices(image: bool = False) -> tuple[list[str], list[str]]:
    choices = list(available_methods())
    default = [m for m in DEFAULT_METHODS if m in choices]
    if image:  # streaming methods read attention rows, which image prompts have too; post-hoc ones must say so
        default = [m for m in default if METHODS[m].streaming or METHODS[m].accepts_extra_inputs]
    return choices, default or choices[:1]


def get_vl_bundle() -> Any:
    """The process-wide vision-language bundle (`EXPLAINER_VLM`), loaded on first use like `get_bundle`."""
    if VLM_ID is None:
        raise gr.Error(_NO_VLM.replace("**", "").replace("`", ""))
    with _load_lock:
        return _load(VLM_ID)


def vlm_info() -> str:
    """Markdown line on the image tab: the vision-language model, or why there is none and how to set one."""
    if VLM_ID is None:
        return _NO_VLM
    try:
        bundle = get_vl_bundle()
    except ExplainerError as e:
        return f"**Could not load the vision-language model `{VLM_ID}`:** {e}"
    if getattr(bundle, "image_processor", None) is None:
        return f"**`{bundle.name}` reads text only.** {_NO_VLM}"
    return f"**Vision-language model:** `{bundle.name}` · the image is resized to a bounded number of image tokens"


def render_image(
    state: dict | None, methods: list[str], step: float | None, opacity: float, contour: bool
) -> tuple[Any, str, str]:
    """Overlays (one per method), answer and question heatmap for one step of a stored image result.

    Args:
        state: {"attr": Attribution, "image": PIL image} of the session, or None before the first question.
        methods: methods to show, one overlay each.
        step: 1-based step from the slider (None: the newest).
        opacity: overlay alpha in [0, 1].
        contour: outline the top `CONTOUR_TOP_PERCENT`% of each map.
    """
    if not state:
        return None, "", _EMPTY_IMAGE
    attr, image = state["attr"], state["image"]
    methods = list(methods or [])
    index = _step_index(step)
    alpha = min(max(_number(opacity, "Overlay opacity"), 0.0), 1.0)
    top = CONTOUR_TOP_PERCENT if contour else None
    grid = overlay_grid(image, attr, methods, index, alpha=alpha, contour_top_percent=top) if methods else None
    return grid, answer_html(attr, index), side_by_side_html(attr, methods, index, user_only=True)


async def explain_image(
    image: Any,
    question: str,
    methods: list[str],
    max_new_tokens: float,
    opacity: float,
    contour: bool,
    max_image_tokens: float | None = None,
    answer: str | None = None,
    *options: Any,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> AsyncIterator[tuple]:
    """Answer a question about an image (or explain the given `answer`, teacher-forced), yielding overlays as tokens
    arrive. `max_image_tokens` bounds the image's resolution (merged image tokens; more means finer maps and a
    slower answer).

    The event runs with `preprocess=False`: `gr.Image` would open every upload with PIL before this handler runs
    (even with `type="filepath"`), and a broken file would fail there with Gradio's generic error. So `image` is
    the upload's raw payload (a dict with the file's path, or an inline data: URL), or a path, bytes or PIL image
    when called directly; the library's `load_image` opens it and says what is wrong with a broken file.

    Yields:
        (overlay grid image, answer HTML, question heatmap HTML, step-slider update, status text, State dict with
        the loaded PIL image).
    """
    methods = list(methods or [])
    if not methods:
        raise gr.Error("Select at least one attribution method.")
    if image is None:
        raise gr.Error("Upload an image (or pick an example) first.")
    max_new_tokens = _whole(max_new_tokens, "Max new tokens", IMAGE_NEW_TOKENS)
    if max_image_tokens is not None:
        max_image_tokens = _whole(max_image_tokens, "Image detail", IMAGE_TOKENS)
    opacity = min(max(_number(opacity, "Overlay opacity"), 0.0), 1.0)
    answer = _answer_text(answer)
    image = await anyio.to_thread.run_sync(_open_image, image)  # decoding a large photo takes a while
    try:
        bundle = get_vl_bundle()
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    yield *[gr.skip()] * 4, _waiting_note(bundle) or _STARTING, gr.skip()  # as in `explain`
    stream = stream_explain(
        bundle,
        question,
        methods=methods,
        max_new_tokens=_answer_budget(answer, max_new_tokens),
        image=image,
        max_image_tokens=max_image_tokens,
        method_options=chosen_options(methods, options),
        progress=lambda fraction, message: progress(fraction, desc=message),
        cancel=CancelToken(),
        answer=answer,
    )
    attr = None
    async for attr in follow(stream):
        yield _image_outputs(attr, image, methods, opacity, contour, live=attr.meta.get("status") != "done")
    if attr is None:
        raise gr.Error("The model produced no tokens. Try another question or more new tokens.")
    yield _image_outputs(attr, image, methods, opacity, contour, live=False)


def _open_image(image: Any) -> Any:
    """The upload as a checked RGB PIL image (named by its file name in messages), or a `gr.Error` saying why not."""
    name = Path(image).name if isinstance(image, str | Path) else None
    if isinstance(image, dict):  # gradio's payload: {"path": ..., "url": ..., "orig_name": ...}
        url = image.get("url") or ""
        name = image.get("orig_name") or (Path(image["path"]).name if image.get("path") else None)
        if url.startswith("data:"):  # sent inline through the API
            try:
                image = base64.b64decode(url.partition(",")[2], validate=True)
            except (binascii.Error, ValueError) as e:
                raise gr.Error("The image was sent as a data: URL that is not valid base64.") from e
        elif image.get("path"):
            image = str(image["path"])
        else:
            raise gr.Error("The image upload carries no file: upload it again.")
    try:
        return load_image(image, name=name)
    except ExplainerError as e:
        raise gr.Error(str(e)) from e


def _image_outputs(attr: Attribution, image: Any, methods: list[str], opacity: float, contour: bool, live: bool):
    state = {"attr": attr, "image": image}
    slider, _ = _sliders(attr, live, span=False)
    grid, answer, question = render_image(state, methods, slider["value"], opacity, contour)
    return grid, answer, question, slider, _status(attr, live), state


def after_image(state: dict | None, status: str | None = None) -> tuple:
    """As `after_explain`, for the image tab: (status text, step-slider update), or skips."""
    status, step, _ = after_explain(state.get("attr") if isinstance(state, dict) else None, status)
    return status, step


def export_image_files(state: dict | None, methods: list[str], opacity: float, contour: bool) -> tuple:
    """The image tab's "JSON", "HTML report" (with the overlays) and "GIF" downloads of the session's result.

    Returns:
        (JSON, HTML report, GIF) DownloadButton updates; all off without a result.
    """
    attr = state.get("attr") if isinstance(state, dict) else None
    if not isinstance(attr, Attribution) or not attr.num_steps:
        return gr.update(**_NO_FILE), gr.update(**_NO_FILE), gr.update(**_NO_FILE)
    image, methods = state.get("image"), _exported_methods(attr, methods)
    alpha = min(max(_number(opacity, "Overlay opacity"), 0.0), 1.0)
    top = CONTOUR_TOP_PERCENT if contour else None
    try:
        gif = _download(gif_bytes(image, attr, methods, alpha, top), export_filename(attr, "gif"))
    except ValueError:  # no method has scores yet
        gif = gr.update(**_NO_FILE)
    report = report_html(attr, methods, image=image, alpha=alpha)
    return (
        _download(result_json(attr), export_filename(attr, "json")),
        _download(report, export_filename(attr, "html", "report")),
        gif,
    )


def export_image_view(state: dict | None, methods: list[str], step: float | None, opacity: float) -> dict:
    """The image tab's "PNG of this view": the overlays and question heatmaps of the step on the slider."""
    attr = state.get("attr") if isinstance(state, dict) else None
    if not isinstance(attr, Attribution) or not attr.num_steps:
        return gr.update(**_NO_FILE)
    alpha = min(max(_number(opacity, "Overlay opacity"), 0.0), 1.0)
    image = view_png(attr, list(methods or []), _step_index(step), image=state.get("image"), alpha=alpha)
    return _download(png_bytes(image), export_filename(attr, "png"))


def _example_images() -> list[Path]:
    return sorted(IMAGES_DIR.glob("*.png")) if IMAGES_DIR.is_dir() else []


_ESTIMATE_HINT = "Type a prompt to see how long the slower methods would take on it."


def method_estimates(
    prompt: str, max_new_tokens: float, chat_template: bool, attr: Any, answer: str | None, *options: Any
) -> str:
    """Markdown under the method checkboxes: the extra time of each slower method on this prompt and answer length
    (the given answer's, when the *Answer* box is filled).

    Tokenises the prompt only; the model's speed is probed once per process (briefly, and not while another
    request holds the model), and a finished result in `attr` corrects the figures of the methods it ran.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        return _ESTIMATE_HINT
    try:
        new = _whole(max_new_tokens, "Max new tokens", NEW_TOKENS)
        bundle = get_bundle()
        calibrate(bundle, attr if isinstance(attr, Attribution) else None)
        estimates = estimate(
            bundle, prompt, max_new_tokens=new, chat_template=bool(chat_template),
            method_options=chosen_options(available_methods(), options),
            answer=answer if isinstance(answer, str) else None,
        )  # fmt: skip
    except (ExplainerError, gr.Error) as e:
        return f"No time estimate: {getattr(e, 'message', None) or e}"
    slow = [e for e in estimates if not e.cost.free]
    if not slow:
        return ""
    parts = " · ".join(f"**{e.method}** {e.describe()}{' ✓' if e.corrected else ''}" for e in slow)
    length = "the given answer" if isinstance(answer, str) and answer.strip() else f"up to {new} new"
    return (
        f"Extra time for this prompt ({slow[0].prompt_tokens} tokens, {length}): {parts}. "
        "Rough figures from a short speed probe of this model; ✓: corrected by that method's own last run here."
    )


def build_text_tab(option_widgets: list) -> Any:
    """The text tab: prompt and optional answer, methods, answer strip, step (and span) sliders, heatmaps, downloads,
    opening a saved result, and the faithfulness panel; returns the model line that `demo.load` fills."""
    model_md = gr.Markdown("**Model:** loading…")
    state = gr.State(None)
    with gr.Row():
        with gr.Column(scale=3):
            prompt_box = gr.Textbox(label="Prompt", lines=6, placeholder="Ask a question, or paste a context and ask.")
            answer_box = gr.Textbox(
                label="Answer (optional)",
                lines=2,
                placeholder="Leave empty to generate. Or paste an answer to explain it: it is teacher-forced, and "
                "every method explains each of its tokens as if the model had written it.",
            )
            with gr.Row():
                generate_btn = gr.Button("Generate", variant="primary")
                cancel_btn = gr.Button("Cancel", variant="stop")
            examples = _examples()
            gr.Examples(
                examples=[[e["prompt"]] for e in examples],
                inputs=[prompt_box],
                example_labels=[e["label"] for e in examples],
                label="Examples",
            )
            open_file = gr.File(label="Open a saved result (.json)", file_types=[".json"], type="filepath", height=110)
        with gr.Column(scale=2):
            choices, default_methods = _method_choices()
            methods_box = gr.CheckboxGroup(choices, value=default_methods, label="Attribution methods")
            estimate_md = gr.Markdown(_ESTIMATE_HINT)
            show_all_box = gr.Checkbox(False, label="Show all tokens (incl. chat template)")
            chat_template_box = gr.Checkbox(True, label="Use the chat template")
            max_new_slider = gr.Slider(
                *NEW_TOKENS, value=64, step=1, label="Max new tokens", info="A given answer raises it to fit."
            )
    status_md = gr.Markdown()
    answer_view = gr.HTML()
    step_slider = gr.Slider(
        1, 2, value=1, step=1, interactive=False, label="Generation step (the answer token being explained)"
    )
    with gr.Row(equal_height=True):
        span_box = gr.Checkbox(False, label="Explain a span of answer tokens (mean of their z-scores)")
        granularity_radio = gr.Radio(list(GRANULARITIES), value="token", label="Prompt units")
    span_end_slider = gr.Slider(
        1, 2, value=1, step=1, interactive=False, visible=False, label="Span end (the span runs from the step above)"
    )
    heatmap_view = gr.HTML(_EMPTY_HEATMAP)
    table = gr.Dataframe(
        headers=TABLE_HEADERS,
        datatype=["str", "number", "str", "number", "number"],
        interactive=False,
        label="Top prompt tokens at this step",
    )
    with gr.Row():
        json_btn = gr.DownloadButton("Download JSON", interactive=False, size="sm")
        report_btn = gr.DownloadButton("Download HTML report", interactive=False, size="sm")
        png_btn = gr.DownloadButton("Download PNG of this view", interactive=False, size="sm")
    downloads = [json_btn, report_btn, png_btn]

    explain_event = generate_btn.click(
        on_gpu(explain),  # ZeroGPU: a GPU is attached while the handler runs; elsewhere the handler itself
        inputs=[
            prompt_box, methods_box, max_new_slider, chat_template_box, show_all_box, answer_box, span_box,
            granularity_radio, *option_widgets,
        ],
        outputs=[answer_view, heatmap_view, table, step_slider, span_end_slider, status_md, state],
        api_name="explain",
        concurrency_limit=1,  # one generation at a time on the shared model; others wait in the queue
        concurrency_id="model",
        show_progress_on=status_md,  # one progress line; the answer and views stay readable while they stream
    )  # fmt: skip
    generate_btn.click(
        lambda: (gr.update(**_NO_FILE),) * 3, outputs=downloads, queue=False, show_progress="hidden",
        api_name="clear_downloads",
    )  # fmt: skip
    view_inputs = [state, methods_box, step_slider, show_all_box, span_box, span_end_slider, granularity_radio]
    png_inputs = [state, methods_box, step_slider, show_all_box, span_box, granularity_radio]
    gr.on(
        triggers=[
            step_slider.input,
            show_all_box.input,
            methods_box.input,
            span_end_slider.input,
            granularity_radio.input,
        ],
        fn=render,
        inputs=view_inputs,
        outputs=[answer_view, heatmap_view, table],
        api_name="render",
        trigger_mode="always_last",
        show_progress="hidden",
    ).then(export_view, inputs=png_inputs, outputs=png_btn, api_name="export_view", show_progress="hidden")
    span_box.input(
        span_controls, inputs=[state, span_box], outputs=[step_slider, span_end_slider, table], api_name="span",
        show_progress="hidden",
    ).then(
        render, inputs=view_inputs, outputs=[answer_view, heatmap_view, table], api_name="render_span",
        show_progress="hidden",
    ).then(
        export_view, inputs=png_inputs, outputs=png_btn, api_name="export_span_view", show_progress="hidden"
    )  # fmt: skip
    gr.on(
        triggers=[show_all_box.input, methods_box.input],
        fn=export_report,
        inputs=[state, methods_box, show_all_box],
        outputs=report_btn,
        api_name="export_report",
        trigger_mode="always_last",
        show_progress="hidden",
    )
    # Cancel only cancels; what a stopped request shows is set by `after_explain`, which Gradio runs once the
    # cancelled request has stopped (a handler of the Cancel click itself would race with the request's last update).
    cancel_btn.click(None, cancels=[explain_event])
    explain_event.then(
        after_explain, inputs=[state, status_md], outputs=[status_md, step_slider, span_end_slider],
        api_name="after_explain", show_progress="hidden",
    ).then(
        export_files, inputs=[state, methods_box, show_all_box], outputs=[json_btn, report_btn],
        api_name="export_files", show_progress="hidden",
    ).then(export_view, inputs=png_inputs, outputs=png_btn, api_name="export_view_after_explain",
           show_progress="hidden")  # fmt: skip
    open_file.upload(
        open_saved,
        inputs=[open_file, show_all_box, span_box, granularity_radio],
        outputs=[state, methods_box, answer_view, heatmap_view, table, step_slider, span_end_slider, status_md],
        api_name="open_saved",
    ).then(
        export_files, inputs=[state, methods_box, show_all_box], outputs=[json_btn, report_btn],
        api_name="export_files_after_open", show_progress="hidden",
    ).then(export_view, inputs=png_inputs, outputs=png_btn, api_name="export_view_after_open",
           show_progress="hidden")  # fmt: skip
    estimate_inputs = [prompt_box, max_new_slider, chat_template_box, state, answer_box, *option_widgets]
    gr.on(
        triggers=[
            prompt_box.change,
            answer_box.change,
            max_new_slider.change,
            chat_template_box.change,
            *(w.change for w in option_widgets),
        ],
        fn=method_estimates,
        inputs=estimate_inputs,
        outputs=estimate_md,
        api_name="estimate",
        trigger_mode="always_last",  # typing sends many changes: only the newest is estimated
        show_progress="hidden",
    )
    explain_event.then(  # a finished answer corrects the figures of the methods it ran
        method_estimates, inputs=estimate_inputs, outputs=estimate_md, api_name="estimate_after_explain",
        show_progress="hidden",
    )  # fmt: skip
    build_faithfulness_panel(state, methods_box, step_slider)
    return model_md


def build_faithfulness_panel(state: Any, methods_box: Any, step_slider: Any) -> None:
    """The faithfulness accordion of the text tab, measuring the result in `state`."""
    with gr.Accordion("Faithfulness", open=False):
        gr.Markdown(_FAITHFULNESS_NOTE)
        faith_state = gr.State(None)
        with gr.Row():
            faith_btn = gr.Button("Measure faithfulness")
            faith_cancel_btn = gr.Button("Cancel", variant="stop")
            faith_metric = gr.Dropdown(list(FAITHFULNESS_METRICS), value="mean logit", label="Removal curve metric")
            soft_choice = gr.Radio(list(SOFT_CHOICES), value=SOFT_CHOICES[0], label="π-Soft over")
        soft_cost_md = gr.Markdown()
        faith_status = gr.Markdown()
        faith_removal_plot = gr.Plot(label="Token removal: MIF / LIF")
        faith_soft_plot = gr.Plot(label="π-Soft-NS / π-Soft-NC")
        faith_table = gr.Dataframe(
            headers=FAITHFULNESS_HEADERS,
            datatype=["str"] + ["number"] * (len(FAITHFULNESS_HEADERS) - 1),
            interactive=False,
            label="Summary",
        )
    faith_event = faith_btn.click(
        on_gpu(faithfulness),
        inputs=[state, methods_box, faith_metric, soft_choice, step_slider],
        outputs=[faith_removal_plot, faith_soft_plot, faith_table, faith_status, faith_state],
        api_name="faithfulness",
        concurrency_limit=1,  # shares the model with the explain event
        concurrency_id="model",
        show_progress_on=faith_status,  # one progress line; the removal curves stay readable while pi-Soft runs
    )
    faith_cancel_btn.click(None, cancels=[faith_event])  # the status is set after the request stops (see text tab)
    faith_event.then(
        after_faithfulness, inputs=faith_status, outputs=faith_status, api_name="after_faithfulness",
        show_progress="hidden",
    )  # fmt: skip
    gr.on(
        triggers=[soft_choice.input, step_slider.release, methods_box.input, state.change],
        fn=soft_cost_note,
        inputs=[state, methods_box, soft_choice, step_slider, faith_state],
        outputs=soft_cost_md,
        show_progress="hidden",
        queue=False,
    )
    faith_metric.input(
        render_faithfulness,
        inputs=[faith_state, faith_metric],
        outputs=[faith_removal_plot, faith_soft_plot, faith_table],
        api_name="render_faithfulness",
        show_progress="hidden",
    )


def build_image_tab(option_widgets: list) -> Any:
    """The image + question tab; returns the vision-model line that `demo.load` fills."""
    choices, default_methods = _method_choices(image=True)
    vlm_md = gr.Markdown("**Vision-language model:** checking…")
    image_state = gr.State(None)
    with gr.Row():
        with gr.Column(scale=3):
            image_box = gr.Image(type="filepath", label="Image", height=280, sources=["upload", "clipboard"])
            question_box = gr.Textbox(label="Question", lines=2, value=DEFAULT_QUESTION)
            image_answer_box = gr.Textbox(
                label="Answer (optional)", lines=1, placeholder="Leave empty to generate, or give an answer to explain."
            )
            with gr.Row():
                ask_btn = gr.Button("Ask about the image", variant="primary")
                image_cancel_btn = gr.Button("Cancel", variant="stop")
            gr.Examples(
                examples=[[str(path), DEFAULT_QUESTION] for path in _example_images()],
                inputs=[image_box, question_box],
                label="Example images",
            )
        with gr.Column(scale=2):
            image_methods_box = gr.CheckboxGroup(choices, value=default_methods, label="Attribution methods")
            opacity_slider = gr.Slider(0, 1, value=0.5, step=0.05, label="Overlay opacity")
            contour_box = gr.Checkbox(True, label=f"Outline the top {CONTOUR_TOP_PERCENT}% of the image")
            image_max_new_slider = gr.Slider(
                *IMAGE_NEW_TOKENS, value=24, step=1, label="Max new tokens", info="A given answer raises it to fit."
            )
            image_tokens_slider = gr.Slider(
                *IMAGE_TOKENS,
                value=DEFAULT_MAX_IMAGE_TOKENS,
                step=16,
                label="Image detail: at most this many image tokens (finer maps, slower answers)",
            )
    image_status_md = gr.Markdown()
    image_answer_view = gr.HTML()
    image_step_slider = gr.Slider(
        1, 2, value=1, step=1, interactive=False, label="Generation step (the answer token being explained)"
    )
    overlay_view = gr.Image(label="Image regions each method credits for this token", interactive=False)
    question_view = gr.HTML(label="Question tokens")
    with gr.Row():
        image_downloads = [
            gr.DownloadButton(f"Download {what}", interactive=False, size="sm")
            for what in ("JSON", "HTML report", "PNG of this view", "GIF")
        ]

    image_event = ask_btn.click(
        on_gpu(explain_image),
        inputs=[
            image_box,
            question_box,
            image_methods_box,
            image_max_new_slider,
            opacity_slider,
            contour_box,
            image_tokens_slider,
            image_answer_box,
            *option_widgets,
        ],
        outputs=[
            overlay_view,
            image_answer_view,
            question_view,
            image_step_slider,
            image_status_md,
            image_state,
        ],
        api_name="explain_image",
        preprocess=False,  # the handler opens the upload itself (see explain_image)
        concurrency_limit=1,
        concurrency_id="model",
        show_progress_on=image_status_md,  # one progress line (see the text tab)
    )
    gr.on(
        triggers=[image_step_slider.input, opacity_slider.input, contour_box.input, image_methods_box.input],
        fn=render_image,
        inputs=[image_state, image_methods_box, image_step_slider, opacity_slider, contour_box],
        outputs=[overlay_view, image_answer_view, question_view],
        api_name="render_image",
        trigger_mode="always_last",
        show_progress="hidden",
    ).then(
        export_image_view, inputs=[image_state, image_methods_box, image_step_slider, opacity_slider],
        outputs=image_downloads[2], api_name="export_image_view", show_progress="hidden",
    )  # fmt: skip
    ask_btn.click(
        lambda: (gr.update(**_NO_FILE),) * 4, outputs=image_downloads, queue=False, show_progress="hidden",
        api_name="clear_image_downloads",
    )  # fmt: skip
    image_cancel_btn.click(None, cancels=[image_event])  # the status is set after the request stops (see text tab)
    image_event.then(
        after_image, inputs=[image_state, image_status_md], outputs=[image_status_md, image_step_slider],
        api_name="after_image",
        show_progress="hidden",
    ).then(
        export_image_files, inputs=[image_state, image_methods_box, opacity_slider, contour_box],
        outputs=[image_downloads[0], image_downloads[1], image_downloads[3]], api_name="export_image_files",
        show_progress="hidden",
    ).then(
        export_image_view, inputs=[image_state, image_methods_box, image_step_slider, opacity_slider],
        outputs=image_downloads[2], api_name="export_image_view_after_explain", show_progress="hidden",
    )  # fmt: skip
    return vlm_md


OPTION_KEYS = [(m, o.name) for m in available_methods() for o in method_options(m)]

# Gradio keeps a copy of every file it serves (downloads, uploads): hourly, copies older than a day are deleted.
with gr.Blocks(title="Why did the model write that?", delete_cache=(3600, 86400)) as demo:
    gr.Markdown(
        "# Why did the model write that?\n"
        "Type a prompt and press **Generate**. The answer appears token by token; for the selected answer token the "
        "heatmap shows which prompt tokens it relied on (red: more than average, blue: less). Hover a token for its "
        "score."
    )
    with gr.Accordion("Method options (both tabs)", open=False, render=False) as options_box:
        gr.Markdown("Each method's settings, from its config; the defaults are the papers'. See the README, Methods.")
        OPTION_WIDGETS = [component for _, _, component in option_inputs()]
    with gr.Tabs():
        with gr.Tab("Text prompt"):
            model_md = build_text_tab(OPTION_WIDGETS)
        with gr.Tab("Image + question"):
            vlm_md = build_image_tab(OPTION_WIDGETS)
    options_box.render()
    demo.load(model_info, outputs=model_md, api_name="model_info")
    demo.load(vlm_info, outputs=vlm_md, api_name="vlm_info")

demo.queue(default_concurrency_limit=1)


def main() -> None:
    """Serve on GRADIO_SERVER_NAME:GRADIO_SERVER_PORT (default 127.0.0.1:7860); EXPLAINER_LOG sets the log level."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
    logging.getLogger("explainer").setLevel(os.environ.get("EXPLAINER_LOG", "WARNING"))
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        css=_CSS,
    )


if __name__ == "__main__":
    main()
