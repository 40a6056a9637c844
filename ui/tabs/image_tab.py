"""The image tab: a question about an image (and optionally an answer to explain), and for each answer token the
image regions each method credits, as overlays, with the question's tokens as a heatmap below; downloads."""

from __future__ import annotations

import dataclasses
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import gradio as gr
from PIL import Image

from explainer.models.loading import gpu_available
from explainer.result.attribution import Attribution
from explainer.result.sinks import sink_positions
from explainer.runtime.fit import default_image_tokens
from explainer.runtime.precision import cpu_has_native_bf16
from visuals import answer_html, overlay_grid, side_by_side_html
from visuals.export import export_filename, png_bytes, result_json
from visuals.overlay import gif_bytes
from visuals.png import view_png
from visuals.report import report_html

from .. import gpu_time, models
from ..downloads import download, exported_methods, has_steps, no_file
from ..events import KEEP, Components, in_turn, settle
from ..guards import admission, inputs, uploads
from ..guards.errors import user_errors
from ..options import method_choices, offer_image_methods
from ..page import VIEWS_CLASS, busy_on_click, ready_after
from ..panels import reliance
from ..requests import image_request
from ..stream import FOLLOWS_STEP, Phase, RequestState, explain_updates, finished, status_line, step_slider, stopped
from . import examples

IMAGES_DIR = Path(__file__).resolve().parents[2] / "assets" / "images"
DEFAULT_QUESTION = "What is in the image?"
CONTOUR_TOP_PERCENT = 10
EMPTY_QUESTION = "<p>Upload an image, ask a question and press <b>Ask</b>: the question's tokens appear here.</p>"


@dataclass(frozen=True)
class ImageResult:
    """An image tab result in the visitor's State: the attributions and the image they are about (loaded once; a
    list of images, in order, when the question had several)."""

    attr: Attribution
    image: Image.Image | list[Image.Image]
    question: str = ""  # as asked: the faithfulness panel encodes the same prompt again
    max_image_tokens: int | None = None  # the image budget it was asked with (None: the model's default)

    # Unhashable, like the `Attribution` it holds: Gradio tells a State changed by hashing hashable values, and a
    # frozen dataclass's generated hash would fail on the Attribution (every image question ended in an error).
    __hash__ = None  # type: ignore[assignment]

    @property
    def images(self) -> list[Image.Image]:
        return list(self.image) if isinstance(self.image, list) else [self.image]


@dataclass
class ImageView:
    """What an image-tab handler changes, one field per component of `create_ui`; `KEEP` leaves it as it is."""

    overlay: Any = KEEP  # the overlay grid image, one overlay per method
    answer: Any = KEEP  # the answer strip (HTML)
    question: Any = KEEP  # the question's tokens as a heatmap (HTML)
    step: Any = KEEP  # step slider update
    status: Any = KEEP  # the status line
    result: Any = KEEP  # State: ImageResult
    request: Any = KEEP  # State: the RequestState of the newest question
    json_file: Any = KEEP
    report_file: Any = KEEP
    png_file: Any = KEEP
    gif_file: Any = KEEP
    body: Any = KEEP  # the column of the tab's controls and views (hidden without a vision-language model)


VIEWS = ("overlay", "answer", "question")  # what `render_image` draws for the step on the slider
SHOWN = VIEWS + ("step", "status", "result", "request")
FILES = ("json_file", "report_file", "png_file", "gif_file")
VIEWS_IN_TURN = in_turn("image_views")  # every event that draws the views (but the gated request), in arrival order
FILES_IN_TURN = in_turn("image_files")  # and every one that fills the downloads


def _result_attr(result: Any) -> Attribution | None:
    return result.attr if isinstance(result, ImageResult) else None


@user_errors
def render_image(
    result: ImageResult | None,
    methods: list[str],
    step: float | None,
    opacity: float,
    contour: bool,
    hide_sinks: bool = False,
) -> ImageView:
    """Overlays (one per method), answer and question heatmap for one step of a stored image result.

    Args:
        result: the session's result, or None before the first question.
        methods: methods to show, one overlay each.
        step: 1-based step from the slider (None: the newest).
        opacity: overlay alpha in [0, 1] (clamped).
        contour: outline the top `CONTOUR_TOP_PERCENT`% of each map.
        hide_sinks: leave the attention sinks out of the overlays' and the question heatmap's z-scores (hatched).

    Returns:
        The `VIEWS` fields.
    """
    if not isinstance(result, ImageResult):
        return ImageView(overlay=None, answer="", question=EMPTY_QUESTION)
    attr, methods, index = result.attr, list(methods or []), inputs.step_index(step)
    alpha = inputs.fraction(opacity, "Overlay opacity")
    top = CONTOUR_TOP_PERCENT if contour else None
    hide = bool(hide_sinks)
    grid = (
        overlay_grid(result.image, attr, methods, index, alpha=alpha, contour_top_percent=top, hide_sinks=hide)
        if methods
        else None
    )
    question = side_by_side_html(attr, methods, index, user_only=True, hide_sinks=hide)
    return ImageView(overlay=grid, answer=answer_html(attr, index), question=question)


@user_errors
def render_image_sinks(
    result: ImageResult | None, methods: list[str], step: float | None, opacity: float, contour: bool, hide: bool
) -> ImageView:
    """As `text_tab.render_sinks`: `render_image` once an answer is complete, only with sinks left out."""
    if not hide or not isinstance(result, ImageResult) or not sink_positions(result.attr):
        return ImageView()
    return render_image(result, methods, step, opacity, contour, hide)


def _shown(result: ImageResult, methods: list[str], opacity: float, contour: bool, live: bool, **fields: Any):
    step = step_slider(result.attr, live)
    view = render_image(result, methods, step["value"], opacity, contour)
    return dataclasses.replace(view, step=step, status=status_line(result.attr, live), result=result, **fields)


@user_errors
async def explain_image(
    image: Any,
    question: str,
    methods: list[str],
    max_new_tokens: float,
    opacity: float,
    contour: bool,
    max_image_tokens: float | None = None,
    answer: str | None = None,
    more_images: Any = None,
    *options: Any,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> Any:
    """Answer a question about an image (or explain the given `answer`, teacher-forced), yielding overlays as tokens
    arrive. `max_image_tokens` bounds the images' resolution (merged image tokens, shared by all images; more means
    finer maps and a slower answer). `more_images` (the gallery's raw payload) follow the first image.

    The event runs with `preprocess=False`: `gr.Image` would open every upload with PIL before this handler runs
    (even with `type="filepath"`), and a broken file would fail there with Gradio's generic error. So `image` is
    the upload's raw payload, which `requests.open_image` opens, saying what is wrong with a broken file. The
    request is `requests.image_request` of these arguments, as `gpu_time.image_seconds` reads it.

    Yields:
        `ImageView`s with the `SHOWN` fields, as `text_tab.explain` does.
    """
    opacity = inputs.fraction(opacity, "Overlay opacity")
    values = (image, question, methods, max_new_tokens, opacity, contour, max_image_tokens, answer, more_images)
    request = await anyio.to_thread.run_sync(lambda: image_request(*values, *options))  # decoding photos takes a while
    bundle = models.get_vl_bundle()
    updates = explain_updates(bundle, request, progress)
    methods = list(request.method_names)
    async with aclosing(updates):  # as in text_tab.explain
        async for update in updates:
            if update.item is None:
                yield ImageView(status=update.note or KEEP, request=update.request)
            else:
                live = update.request.phase is not Phase.DONE and not finished(update.item)
                result = ImageResult(update.item, request.image, request.prompt, request.max_image_tokens)
                yield _shown(result, methods, opacity, contour, live, request=update.request)


@user_errors
def after_image(
    result: ImageResult | None,
    request: RequestState | None,
    methods: list[str] | None = None,
    opacity: float = 0.5,
    contour: bool = True,
) -> ImageView:
    """As `text_tab.after_explain`, for the image tab: the `SHOWN` fields it changes."""
    stop = stopped(request, _result_attr(result))
    if stop is None:
        return ImageView()
    if not stop.partial:
        return ImageView(status=stop.status or KEEP, request=stop.request)
    view = _shown(result, list(methods or []), opacity, contour, live=False)
    return dataclasses.replace(view, status=stop.status, request=stop.request)


@user_errors
def export_image_files(result: ImageResult | None, methods: list[str], opacity: float, contour: bool) -> ImageView:
    """The "JSON", "HTML report" (with the overlays) and "GIF" downloads of the session's result; off without one."""
    attr = _result_attr(result)
    if not has_steps(attr):
        return ImageView(json_file=no_file(), report_file=no_file(), gif_file=no_file())
    methods = exported_methods(attr, methods)
    alpha, top = inputs.fraction(opacity, "Overlay opacity"), CONTOUR_TOP_PERCENT if contour else None
    try:
        gif = download(gif_bytes(result.image, attr, methods, alpha, top), export_filename(attr, "gif"))
    except ValueError:  # no method has scores yet
        gif = no_file()
    report = report_html(attr, methods, image=result.image, alpha=alpha)
    return ImageView(
        json_file=download(result_json(attr), export_filename(attr, "json")),
        report_file=download(report, export_filename(attr, "html", "report")),
        gif_file=gif,
    )


@user_errors
def export_image_view(result: ImageResult | None, methods: list[str], step: float | None, opacity: float) -> ImageView:
    """The "PNG of this view": the overlays and question heatmaps of the step on the slider."""
    attr = _result_attr(result)
    if not has_steps(attr):
        return ImageView(png_file=no_file())
    alpha = inputs.fraction(opacity, "Overlay opacity")
    image = view_png(attr, list(methods or []), inputs.step_index(step), image=result.image, alpha=alpha)
    return ImageView(png_file=download(png_bytes(image), export_filename(attr, "png")))


def clear_downloads() -> ImageView:
    """Every download off while a new answer is generated."""
    return ImageView(json_file=no_file(), report_file=no_file(), png_file=no_file(), gif_file=no_file())


def example_images() -> list[Path]:
    """The built-in example images."""
    return sorted(IMAGES_DIR.glob("*.png")) if IMAGES_DIR.is_dir() else []


def _question_column(c: Components) -> None:
    c["image"] = gr.Image(type="filepath", label="Image", height=280, sources=["upload", "clipboard"])
    c["more_images"] = gr.Gallery(
        label="More images (optional: asked about together, after the first; they share the image detail)",
        type="filepath", interactive=True, height=180, columns=4, file_types=["image"], object_fit="contain",
    )  # fmt: skip
    c["question_box"] = gr.Textbox(label="Question", lines=2, value=DEFAULT_QUESTION)
    c["given_answer"] = gr.Textbox(
        label="Answer (optional)", lines=1, placeholder="Leave empty to generate, or give an answer to explain."
    )
    with gr.Row():
        c["ask"] = gr.Button("Ask about the image", variant="primary", scale=2, min_width=160, elem_id="image-ask")
        c["cancel"] = gr.Button("Cancel", variant="stop", scale=1, min_width=80)
    uploads.add_examples(example_images())  # a clicked example comes back as a path: the gate lets these through
    gr.Examples(
        examples=[[str(path), DEFAULT_QUESTION] for path in example_images()],
        inputs=[c["image"], c["question_box"]],
        label=examples.IMAGE_EXAMPLES_LABEL,
    )


def _settings_column(c: Components) -> None:
    choices, default_methods = method_choices(image=True)
    c["methods"] = gr.CheckboxGroup(choices, value=default_methods, label="Attribution methods")
    c["methods_note"] = gr.Markdown(visible=False)  # how to make macs_calibrated's weights, for a model without them
    c["opacity"] = gr.Slider(0, 1, value=0.5, step=0.05, label="Overlay opacity")
    c["contour"] = gr.Checkbox(True, label=f"Outline the top {CONTOUR_TOP_PERCENT}% of the image")
    c["max_new"] = gr.Slider(
        *inputs.IMAGE_NEW_TOKENS, value=24, step=1, label="Max new tokens", info="A given answer raises it to fit."
    )
    c["image_tokens"] = gr.Slider(
        *inputs.IMAGE_TOKENS,
        value=default_image_tokens(gpu_available(), cpu_has_native_bf16()),  # 64 on a CPU without native bf16
        step=16,
        label="Image detail: at most this many image tokens (finer maps, slower answers)",
    )


def _views(c: Components) -> None:
    c["status"] = gr.Markdown(elem_classes=["xai-status"])  # carries the request's progress bar
    c["answer"] = gr.HTML()
    c["step"] = gr.Slider(
        1, 2, value=1, step=1, interactive=False, label="Generation step (the answer token being explained)"
    )
    reliance.attach(c)  # the reliance strip, above the overlays (ui/panels/reliance.py)
    c["overlay"] = gr.Image(label="Image regions each method credits for this token", interactive=False, height=420)
    c["question"] = gr.HTML(label="Question tokens")
    with gr.Row():
        for name, what in zip(FILES, ("JSON", "HTML report", "PNG of this view", "GIF")):
            c[name] = gr.DownloadButton(f"Download {what}", interactive=False, size="sm")


@user_errors
def shown_controls() -> ImageView:
    """The tab's controls and views on the first page view: shown only with a vision-language model configured;
    without one, the tab is its model line alone, which says how to turn image questions on (`models.NO_VLM`)."""
    return ImageView(body=gr.update(visible=models.vlm_configured()))


def create_ui() -> Components:
    """The image tab's components (call inside its `gr.Tab`): `model`, the vision-model line `demo.load` fills, over
    `body`, a column hidden until `shown_controls` finds a vision-language model (add the tab's panels inside it).
    In `body`, as in the text tab, the controls sit in a side column with the views beside them (`ui/page.py`)."""
    c = Components()
    c["model"] = gr.Markdown("**Vision-language model:** checking…")
    c["result"] = gr.State(None)
    c["request"] = gr.State(RequestState())
    c["body"] = gr.Column(visible=False)
    with c["body"], gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            _question_column(c)
            _settings_column(c)
        with gr.Column(scale=5, min_width=560, elem_classes=[VIEWS_CLASS]):
            _views(c)
    return c


def create_event_handlers(blocks: gr.Blocks, c: Components, option_widgets: list[Any]) -> None:
    """Wire the image tab's events (its controls shown on the first page view when there is a vision-language
    model); `option_widgets` are the "Method options" widgets."""
    blocks.load(**c.bind(shown_controls, ("body",)), api_name="image_controls", queue=False, show_progress="hidden")
    blocks.load(
        **c.bind(offer_image_methods, ("methods", "methods_note")), inputs=c("methods"), api_name="offer_image_methods",
        show_progress="hidden",
    )  # fmt: skip
    asked = c(
        "image",
        "question_box",
        "methods",
        "max_new",
        "opacity",
        "contour",
        "image_tokens",
        "given_answer",
        "more_images",
    )
    busy_on_click(c["ask"], "Asking…", "ask")  # first: see busy_on_click
    event = c["ask"].click(
        **c.bind(explain_image, SHOWN, gpu=True, duration=gpu_time.image_seconds, gate=admission.MODEL),
        inputs=asked + option_widgets,
        api_name="page_explain_image",  # private: the public /explain_image is ui/api.py's
        preprocess=False,  # the handler opens the upload itself (see explain_image)
        show_progress_on=c["status"],  # one progress line (see the text tab)
    )
    ready_after(event, c["ask"], "ask")
    hidden = {"show_progress": "hidden"}
    follows = {**hidden, **FOLLOWS_STEP}  # events that read the step slider, which a new request may have shrunk
    drawn, exported = {**follows, **VIEWS_IN_TURN}, {**follows, **FILES_IN_TURN}
    view_png = c("result", "methods", "step", "opacity")
    view = c("result", "methods", "step", "opacity", "contour", "hide_sinks")  # hide_sinks: shared (app.py)
    rendered = gr.on(
        triggers=[c[name].input for name in ("step", "opacity", "contour", "methods", "hide_sinks")],
        **c.bind(render_image, VIEWS), inputs=view, api_name="render_image", trigger_mode="always_last", **drawn,
    )  # fmt: skip
    rendered.then(**c.bind(export_image_view, FILES), inputs=view_png, api_name="export_image_view", **exported)
    c["ask"].click(**c.bind(clear_downloads, FILES), queue=False, api_name="clear_image_downloads", **hidden)
    c["cancel"].click(None, cancels=[event])  # the status is set after the request stops (see the text tab)
    event.then(  # loaded now
        models.vlm_info, outputs=c["model"], api_name="vlm_info_after_explain", api_visibility="private", **hidden
    )
    settled = settle(
        event,
        **c.bind(after_image, SHOWN), inputs=c("result", "request", "methods", "opacity", "contour"),
        api_name="after_image", **hidden, **VIEWS_IN_TURN,
    )  # fmt: skip
    # the sinks are known once the answer is complete: drawn again if "Leave out attention sinks" is ticked
    settled.then(**c.bind(render_image_sinks, VIEWS), inputs=view, api_name="render_image_after_explain", **drawn)
    settled.then(
        **c.bind(export_image_files, FILES), inputs=c("result", "methods", "opacity", "contour"),
        api_name="export_image_files", **hidden, **FILES_IN_TURN,
    ).then(
        **c.bind(export_image_view, FILES), inputs=view_png, api_name="export_image_view_after_explain", **exported
    )  # fmt: skip
