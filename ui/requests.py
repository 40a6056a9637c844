"""The explain request of each tab, built from its widget values in one function per tab, and of the public API.

`build_text_request` and `build_image_request` make the request of a text prompt or an image question from named
values, `method_options` as one {method: {option: value}} object; the public API (`ui/api.py`) calls them directly.
The tabs' builders (`text_request`, `image_request`) read the "Method options" widgets into that object first. Each
tab builder takes exactly the arguments of its tab's handler (`text_tab.explain`, `image_tab.explain_image`), in the
same order, because Gradio hands both the handler and its ZeroGPU duration function (`gpu_time`) the same positional
widget values: the handler and `gpu_time` call the same builder, so they read the same `ExplainRequest`. The library
validates the request when it is built (`explainer.request`); the builders add the widgets' own bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from explainer.errors import InputError
from explainer.models.vision import data_url_bytes, load_image
from explainer.request import ExplainRequest

from .guards import inputs
from .guards.uploads import uploaded_path
from .options import chosen_options


def text_request(
    prompt: str, methods: list[str], max_new_tokens: float, chat_template: bool, show_all: bool = False,
    answer: str | None = None, span: bool = False, granularity: str = "token", *options: Any,
) -> ExplainRequest:  # fmt: skip
    """The text tab's request (the arguments of `text_tab.explain`; `show_all` and `span` only choose the view):
    `build_text_request` with the "Method options" widgets' values read (`options.chosen_options`)."""
    methods = inputs.chosen_methods(methods)
    chosen = chosen_options(methods, options)
    return build_text_request(prompt, methods, max_new_tokens, chat_template, answer, granularity, chosen)


def build_text_request(
    prompt: str, methods: list[str], max_new_tokens: float, chat_template: bool = True, answer: str | None = None,
    granularity: str = "token", method_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> ExplainRequest:  # fmt: skip
    """A text prompt's request, from the text tab (`text_request`) or the public API (`ui/api.py`).

    Raises:
        InputError: no method ticked, a slider past its bounds, an answer that is not text, or what the request
            refuses (`ExplainRequest`, which checks `method_options` against each method's config).
    """
    methods = inputs.chosen_methods(methods)
    return ExplainRequest(
        prompt, methods, method_options or {},
        max_new_tokens=inputs.whole(max_new_tokens, "Max new tokens", inputs.NEW_TOKENS),
        chat_template=bool(chat_template), answer=inputs.answer_text(answer), unit=granularity or "token",
    )  # fmt: skip


def image_request(
    image: Any, question: str, methods: list[str], max_new_tokens: float, opacity: Any = None, contour: Any = None,
    max_image_tokens: Any = None, answer: str | None = None, more_images: Any = None, *options: Any,
) -> ExplainRequest:  # fmt: skip
    """The image tab's request (the arguments of `image_tab.explain_image`; `opacity` and `contour` only choose the
    view): `build_image_request` with the "Method options" widgets' values read."""
    methods = inputs.chosen_methods(methods)
    chosen = chosen_options(methods, options)
    return build_image_request(image, question, methods, max_new_tokens, max_image_tokens, answer, more_images, chosen)


def build_image_request(
    image: Any, question: str, methods: list[str], max_new_tokens: float, max_image_tokens: Any = None,
    answer: str | None = None, more_images: Any = None, method_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> ExplainRequest:  # fmt: skip
    """An image question's request, from the image tab (`image_request`) or the public API. Opens the uploads
    (`open_images`): call it off the event loop, a large photo takes a while to decode.

    Raises:
        InputError: as `build_text_request`, no image, or an upload that is not a readable image.
    """
    methods = inputs.chosen_methods(methods)
    if image is None:
        raise InputError("Upload an image (or pick an example) first.")
    new = inputs.whole(max_new_tokens, "Max new tokens", inputs.IMAGE_NEW_TOKENS)
    detail = None if max_image_tokens is None else inputs.whole(max_image_tokens, "Image detail", inputs.IMAGE_TOKENS)
    given = inputs.answer_text(answer)
    opened = open_images(image, more_images)
    return ExplainRequest(
        question, methods, method_options or {}, max_new_tokens=new,
        images=tuple(opened) if isinstance(opened, list) else (opened,), max_image_tokens=detail, answer=given,
    )  # fmt: skip


def open_image(image: Any) -> Image.Image:
    """The upload as a checked RGB PIL image, named by its file name in messages.

    Args:
        image: Gradio's raw upload payload (a dict with the file's path, or an inline data: URL sent through the
            API), a path, bytes or a PIL image. A path, in a payload or not, is opened only if `uploads.uploaded_path`
            lets it through (an upload of this process or an example image).

    Raises:
        InputError: what is wrong with the upload (`vision.load_image` checks the image itself), or `uploads.REFUSED`.
    """
    name = None
    if isinstance(image, dict) and str(image.get("url") or "").startswith("data:"):  # inline: no file is opened
        name = image.get("orig_name") if isinstance(image.get("orig_name"), str) else None
        image = data_url_bytes(image["url"])
    elif isinstance(image, dict | str | Path):  # gradio's payload: {"path": ..., "url": ..., "orig_name": ...}
        path = uploaded_path(image)
        given = image.get("orig_name") if isinstance(image, dict) else None
        name = given if isinstance(given, str) and given else path.name
        image = str(path)
    return load_image(image, name=name)


def open_images(image: Any, more: Any = None) -> Image.Image | list[Image.Image]:
    """The upload, or it and the gallery's images in order (`open_image` each)."""
    extra = [item.get("image", item) if isinstance(item, dict) else item for item in more or []]  # {image, caption}
    extra = [item[0] if isinstance(item, list | tuple) else item for item in extra]  # (path, caption) when direct
    opened = [open_image(one) for one in [image, *extra]]
    return opened if len(opened) > 1 else opened[0]
