"""The app's public API: the endpoints a user calls ("Use via API", `gradio_client`), with typed, named parameters.

Every event of the page itself is private (`api_visibility="private"`, set in `Components.bind`): its inputs and
outputs are widgets and per-visitor State. These endpoints take plain values, build the request with the builders the
tabs use (`requests.build_text_request`, `requests.build_image_request`, `measurement.faithfulness_request`), run it
through the driver the tabs use (`stream.explain_updates`, `stream.run_stream`) and return plain data: an explain
request returns the saved-result JSON text that `explain --json` and "Download JSON" write, which
`explainer.result.load_result` opens and `/open_result` and `/faithfulness` take back.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    saved = client.predict(prompt="Who wrote Hamlet?", methods=["macs"], max_new_tokens=8, api_name="/explain")
    client.predict(result=saved, step=1, api_name="/open_result")  # the first answer token's top prompt tokens

Public endpoints: `ENDPOINTS` here, and the two model lines the page loads (`/model_info`, `/vlm_info`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, get_args, get_origin, get_type_hints

import anyio
import gradio as gr
from gradio.data_classes import FileData

from explainer.errors import InputError
from explainer.faithfulness import stream_faithfulness
from explainer.request import ExplainRequest
from explainer.result.attribution import Attribution, load_result, result_json
from explainer.result.steps import clamp_step
from explainer.runtime.hardware import gpu_duration, on_gpu
from visuals import top_tokens_rows

from . import gpu_time, models
from .guards import admission, inputs, uploads
from .guards.errors import wrap_handler
from .options import DEFAULT_METHODS
from .panels.contrast import contrastive_methods
from .panels.measurement import SOFT_CHOICES, faithfulness_request
from .requests import build_image_request, build_text_request
from .stream import explain_updates, run_stream

CONTRAST_MAX_NEW_TOKENS = inputs.NEW_TOKENS[1]  # the answer is given: only its own length counts


def _no_progress(*_: Any, **__: Any) -> None:
    """The API has no progress bar; the library's progress reports go nowhere."""


async def _results(bundle: Any, request: ExplainRequest) -> AsyncIterator[str]:
    """The request run through the tabs' driver: its growing result as saved-result JSON text, at most a few times a
    second while tokens arrive (`stream.UPDATE_SECONDS`), the complete one last (what `predict` returns)."""
    last = None
    rows: dict[bytes, str] = {}  # each score row's JSON text, written once for the whole stream
    async with aclosing(explain_updates(bundle, request, _no_progress)) as updates:
        async for update in updates:
            if update.item is not None:
                last = update.item
                yield result_json(last, rows=rows)
    if last is None:
        raise InputError("The model produced no result for this request.")


def _text_request(
    prompt: str, methods: list[str] | None = None, max_new_tokens: int = 64, chat_template: bool = True,
    answer: str = "", method_options: dict | None = None,
) -> ExplainRequest:  # fmt: skip
    return build_text_request(
        prompt, methods or DEFAULT_METHODS, max_new_tokens, chat_template, answer, "token", method_options
    )


async def explain(
    prompt: str,
    methods: list[str] | None = None,
    max_new_tokens: int = 64,
    chat_template: bool = True,
    answer: str = "",
    method_options: dict | None = None,
) -> AsyncIterator[str]:
    """Generate an answer to `prompt` (or explain the given `answer`, teacher-forced) with the text model and
    explain every answer token with each method.

    Args:
        prompt: the user's text.
        methods: registered method names (default: macs, rollout); see the README's Methods.
        max_new_tokens: at most this many answer tokens, a whole number from 1 to 256 (greedy decoding stops earlier
            at the end token).
        chat_template: wrap the prompt in the model's chat template.
        answer: empty to generate; else the answer to explain (max_new_tokens is raised to fit it, up to 1,024
            tokens).
        method_options: {method: {option: value}}, e.g. {"macs": {"alpha": 0.5}}; unset options keep their defaults.

    Yields:
        The growing result as saved-result JSON text while the answer arrives, the complete one last (what
        `predict` returns; `explainer.result.load_result` opens it).
    """
    request = _text_request(prompt, methods, max_new_tokens, chat_template, answer, method_options)
    async for saved in _results(models.get_bundle(), request):
        yield saved


def _image_request(
    image: FileData, question: str = "What is in the image?", methods: list[str] | None = None,
    max_new_tokens: int = 24, max_image_tokens: int | None = None, answer: str = "",
    method_options: dict | None = None,
) -> ExplainRequest:  # fmt: skip
    # the image is opened by `requests.open_image`, through the gate of every file a visitor sends (`guards/uploads.py`)
    return build_image_request(
        image, question, methods or ["macs"], max_new_tokens, max_image_tokens, answer, None, method_options
    )


async def explain_image(
    image: FileData,
    question: str = "What is in the image?",
    methods: list[str] | None = None,
    max_new_tokens: int = 24,
    max_image_tokens: int | None = None,
    answer: str = "",
    method_options: dict | None = None,
) -> AsyncIterator[str]:
    """Answer a question about an image with the vision-language model and explain every answer token.

    Args:
        image: the image, uploaded: `gradio_client.handle_file(path)` of a local file (an address is refused: the
            server fetches nothing on a caller's behalf, and opens only files uploaded to it).
        question: the question about it.
        methods: methods that explain images (default: macs).
        max_new_tokens: at most this many answer tokens (1-128).
        max_image_tokens: at most this many merged image tokens (16-1024; None: the app's default).
        answer: empty to generate; else the answer to explain.
        method_options: as in `/explain`.

    Returns:
        The result as saved-result JSON text, with the image grid and `reliance` (how much each token used the image).
    """
    request = await _off_loop(_image_request, image, question, methods, max_new_tokens, max_image_tokens, answer,
                              method_options)  # fmt: skip
    async for saved in _results(models.get_vl_bundle(), request):
        yield saved


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args))  # decoding a photo takes a while


def _contrast_request(
    prompt: str, answer: str, step: int, foil: str, methods: list[str] | None = None, chat_template: bool = True,
    method_options: dict | None = None,
) -> ExplainRequest:  # fmt: skip
    if not isinstance(answer, str) or not answer.strip():
        raise InputError("Give the answer to explain: the contrast explains a given answer, teacher-forced.")
    chosen = contrastive_methods(list(methods or []))  # AtMan when none of them can be contrastive
    request = _text_request(prompt, chosen, CONTRAST_MAX_NEW_TOKENS, chat_template, answer, method_options)
    return request.replace(contrast={round(inputs.number(step, "step")) - 1: foil})


async def contrast(
    prompt: str,
    answer: str,
    step: int,
    foil: str,
    methods: list[str] | None = None,
    chat_template: bool = True,
    method_options: dict | None = None,
) -> AsyncIterator[str]:
    """Why did the model write the answer's token at `step` rather than `foil`? The answer is explained again,
    teacher-forced, with that step contrastive (AtMan and the gradient methods; the attention methods cannot be).

    Args:
        prompt: the prompt the answer was given to.
        answer: the answer's text (a result's `generated_tokens` joined).
        step: the answer token to contrast, 1-based.
        foil: the alternative, one token of text (e.g. " London"; the result's `meta.alternatives` lists likely ones).
        methods: methods (default: atman; AtMan is added when none of them can be contrastive).
        chat_template: as the answer was generated.
        method_options: as in `/explain`.

    Returns:
        The result as saved-result JSON text; `meta.contrast` records the foil.
    """
    request = _contrast_request(prompt, answer, step, foil, methods, chat_template, method_options)
    async for saved in _results(models.get_bundle(), request):
        yield saved


RESULT_TEXT = "The result text"  # what messages call a saved result sent as text (not a file)


def _opened(result: str) -> Attribution:
    """A saved result sent as its JSON text (`load_result`, its messages naming text, not a file)."""
    return load_result(result.encode("utf-8") if isinstance(result, str) else result, name=RESULT_TEXT)


def _measured_result(result: str) -> Attribution:
    attr = _opened(result)
    if attr.image is not None:
        raise InputError("This result is an image question's: measure its faithfulness in the app's image tab.")
    return attr


def _faithfulness_request(result: str, methods: list[str] | None = None, pi_soft: bool = False,
                          step: int | None = None) -> Any:  # fmt: skip
    attr = _measured_result(result)
    soft = SOFT_CHOICES[2] if not pi_soft else SOFT_CHOICES[1] if step is None else SOFT_CHOICES[0]
    return attr, faithfulness_request(attr, methods or list(attr.methods), soft, step)


async def faithfulness(
    result: str, methods: list[str] | None = None, pi_soft: bool = False, step: int | None = None
) -> AsyncIterator[dict]:
    """How faithful a text result's explanations are: removal curves (MIF / LIF / SRG) and, with `pi_soft`, the
    pi-Soft curves, measured with the app's text model (the one that made the result).

    Args:
        result: a result's saved JSON text (what `/explain` returns).
        methods: the result's methods to measure (default: all of them; the random baseline is added).
        pi_soft: measure pi-Soft too (slower).
        step: pi-Soft at this 1-based answer step (None: every 5th).

    Returns:
        {"model", "methods", "seconds", "removal": {...}, "soft": {...} or null}, as `faithfulness --json` writes.
    """
    attr, request = _faithfulness_request(result, methods, pi_soft, step)
    bundle = models.get_bundle()
    if attr.model != bundle.name:
        raise InputError(
            f"This result is {attr.model}'s; the app's text model is {bundle.name}: explain it here first."
        )

    def start(cancel: Any) -> Any:
        return stream_faithfulness(bundle, attr, request, progress=_no_progress, cancel=cancel)

    report = None
    async with aclosing(run_stream(bundle, start, "Faithfulness produced no result.")) as updates:
        async for update in updates:
            report = update.item if update.item is not None else report
    yield {
        "model": attr.model, "methods": list(request.methods), "seconds": report.seconds,
        "removal": dataclasses.asdict(report.removal) if report.removal else None,
        "soft": dataclasses.asdict(report.soft) if report.soft else None,
    }  # fmt: skip


def open_result(result: str, step: int | None = None, top_k: int = 5) -> dict:
    """Open a saved result without running a model: its answer and, for one answer token, each method's top prompt
    tokens (the page's table).

    Args:
        result: a result's saved JSON text (`/explain`, "Download JSON" or `explain --json`).
        step: the answer token, 1-based (None: the last).
        top_k: rows per method.

    Returns:
        {"model", "answer", "steps", "step", "token", "top_tokens": {method: [{"rank", "token", "position", "z"}]}}.
    """
    attr = _opened(result)
    index = clamp_step(inputs.step_index(step), attr.num_steps)
    k = inputs.whole(top_k, "top_k", (1, 100))
    rows = {m: top_tokens_rows(attr, m, index, k) for m in attr.methods}
    return {
        "model": attr.model, "answer": attr.generated_text, "steps": attr.num_steps,
        "step": None if index is None else index + 1,
        "token": None if index is None else attr.generated_tokens[index],
        "top_tokens": {
            m: [dict(zip(("rank", "token", "position", "z"), row)) for row in method_rows]
            for m, method_rows in rows.items()
        },
    }  # fmt: skip


def _seconds_of(build: Callable[..., ExplainRequest]) -> Callable[..., int]:
    """The ZeroGPU duration function of an endpoint whose arguments `build` turns into its request."""
    return lambda *args, **kwargs: gpu_time.seconds_of(functools.partial(build, *args, **kwargs))


def _faithfulness_seconds(result: str, methods: Any = None, pi_soft: bool = False, step: Any = None) -> int:
    try:
        attr, request = _faithfulness_request(result, methods, pi_soft, step)
    except InputError:
        return gpu_duration(0)  # refused at once in the call itself
    return gpu_duration(gpu_time.faithfulness_request_seconds(attr, request))


# name: (function, its ZeroGPU duration function (None: it runs no model), the page's event it queues with)
ENDPOINTS: dict[str, tuple[Callable[..., Any], Callable[..., int] | None, str | None]] = {
    "explain": (explain, _seconds_of(_text_request), "page_explain"),
    "explain_image": (explain_image, _seconds_of(_image_request), "page_explain_image"),
    "contrast": (contrast, _seconds_of(_contrast_request), "explain_contrast"),
    "faithfulness": (faithfulness, _faithfulness_seconds, "page_faithfulness"),
    "open_result": (open_result, None, None),
}


def endpoint(
    fn: Callable[..., Any], duration: Callable[..., int] | None, gate: str | None = None
) -> Callable[..., Any]:
    """`fn` as Gradio runs it: on the GPU where there is one (for `duration`'s seconds, as the tabs' handlers),
    behind the admission gate of the page's event (`gate`: the same limits, turns and refusals), the library's errors
    as `gr.Error`, and a signature whose return type is what a streaming endpoint yields (Gradio reads the API's types
    from it; its first parameter, the `gr.Request` the gate reads, is not one of the API's)."""
    handler = on_gpu(fn, duration) if duration is not None else fn  # the order `Components.bind` uses
    handler = wrap_handler(admission.gated(handler, gate) if gate is not None else handler)
    returned = get_type_hints(fn).get("return")
    if get_origin(returned) is AsyncIterator:
        (returned,) = get_args(returned)
    handler.__signature__ = inspect.signature(handler).replace(return_annotation=returned)
    return handler


def create_endpoints(blocks: gr.Blocks) -> None:
    """Add the public endpoints to `blocks` (call inside it, after the tabs' events). Each one that runs a model
    queues with the page's event of the same request (its admission gate, concurrency limit and group), so API
    callers and visitors share the model, and its limits, as the page's events share them. The files that `blocks`'
    /upload route stores, for the page and the API alike, are the only ones the handlers may open
    (`uploads.watch`)."""
    uploads.watch(blocks.upload_file_set)
    page = {fn.api_name: fn for fn in blocks.fns.values()}
    for name, (fn, duration, event) in ENDPOINTS.items():
        queued = page.get(event) if event else None
        same = (
            {"concurrency_limit": queued.concurrency_limit, "concurrency_id": queued.concurrency_id} if queued else {}
        )
        gated = queued is not None and str(queued.concurrency_id).startswith("gate_")
        gate = str(queued.concurrency_id).removeprefix("gate_") if gated else None
        gr.api(endpoint(fn, duration, gate), api_name=name, api_description=inspect.getdoc(fn), **same)
