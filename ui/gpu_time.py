"""How much GPU time each ZeroGPU call asks for: from the request's time estimate, not a constant.

`spaces.GPU(duration=...)` takes a function of the handler's own arguments; these are those functions, one per
handler that runs the model (`Components.bind(..., duration=...)`). They never run the model: the estimates use the
speed measured inside an earlier GPU call, or `estimate.ASSUMED_SPEED` until one has run
(`hardware.gpu_duration` adds the margin and the bounds). Asking too little stops a request midway; asking too much
spends the visitor's ZeroGPU quota, which counts the time asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from explainer.errors import ExplainerError
from explainer.estimate import ASSUMED_SPEED, answer_steps, estimate
from explainer.faithfulness import FaithfulnessRequest, soft_cost
from explainer.faithfulness.common import RANKED
from explainer.methods import METHODS
from explainer.request import ExplainRequest
from explainer.result.attribution import Attribution
from explainer.runtime.hardware import gpu_duration

from . import models, requests
from .panels.measurement import SOFT_CHOICES, faithfulness_request, is_image_result, measured

DECODE_TOKENS_PER_S = 10.0  # a GPU's greedy decoding with capture on, at worst (first request included)
IMAGE_PREFILL_SECONDS = 10.0  # vision tower and prefill of an image prompt
IMAGE_POST_HOC_SECONDS = 120.0  # AtMan on an image prompt: N suppression passes (no estimate for images yet)
REMOVAL_SECONDS_PER_STEP = 1.0  # removal curves: regenerations per answer token and method, on a GPU


def text_seconds(*asked: Any, **_: Any) -> int:
    """GPU seconds for the text tab's `explain` with these arguments: its request (`requests.text_request`)."""
    return seconds_of(requests.text_request, *asked)


def image_seconds(*asked: Any, **_: Any) -> int:
    """GPU seconds for the image tab's `explain_image` with these arguments: its request
    (`requests.image_request`, which opens the uploads as the handler does)."""
    return seconds_of(requests.image_request, *asked)


def seconds_of(build: Callable[..., ExplainRequest], *asked: Any) -> int:
    """GPU seconds of the request a tab's builder makes of its handler's arguments (`request_seconds`); a request
    that the builder or the estimate refuses gets the minimum: it fails fast in the call itself."""
    try:
        return request_seconds(build(*asked))
    except ExplainerError:
        return gpu_duration(None)


def request_seconds(request: ExplainRequest) -> int:
    """GPU seconds for an explain request: decoding K answer tokens (a given answer's tokens, else
    `max_new_tokens`) and each method's extra time; for an image prompt the vision prefill and, per post-hoc method,
    `IMAGE_POST_HOC_SECONDS` (no estimate for images yet).

    Raises:
        ExplainerError: the estimate refuses the request.
    """
    given = request.answer if isinstance(request.answer, str) else None  # token ids: K is their number
    if request.images:
        steps = answer_steps(models.get_vl_bundle(), given, request.num_steps) if given else request.num_steps
        post_hoc = [m for m in request.method_names if m in METHODS and not METHODS[m].streaming]
        post_hoc_seconds = IMAGE_POST_HOC_SECONDS * len(post_hoc)
        return gpu_duration(IMAGE_PREFILL_SECONDS + steps / DECODE_TOKENS_PER_S + post_hoc_seconds)
    bundle = models.get_bundle()
    figures = estimate(
        bundle, request.prompt, list(request.method_names), max_new_tokens=request.num_steps,
        chat_template=request.chat_template, method_options=request.method_options, answer=given, probe=False,
    )  # fmt: skip
    steps = answer_steps(bundle, given, request.num_steps)
    extra = [e.seconds for e in figures if not e.cost.free]
    if any(s is None for s in extra):
        return gpu_duration(None)
    return gpu_duration(steps / DECODE_TOKENS_PER_S + sum(extra))


def faithfulness_seconds(
    result: Any, methods: list[str], metric: str = "", soft_choice: str = SOFT_CHOICES[0], step: Any = None,
    rank: str = RANKED[0],
    *_: Any, **__: Any,
) -> int:  # fmt: skip
    """GPU seconds for the faithfulness panel's `faithfulness` with these arguments: the request its handler builds
    from them (`measurement.faithfulness_request`), sized by `faithfulness_request_seconds`."""
    try:
        request = faithfulness_request(result, methods, soft_choice, step, rank)
    except (ExplainerError, ValueError):
        return gpu_duration(0)  # the handler refuses the same request at once
    try:
        return gpu_duration(faithfulness_request_seconds(measured(result), request, image=is_image_result(result)))
    except ExplainerError:
        return gpu_duration(None)


def faithfulness_request_seconds(attr: Attribution, request: FaithfulnessRequest, image: bool = False) -> float:
    """Expected seconds of a faithfulness request on a GPU: removal curves per answer token and method (and the
    random baseline), an image result's vision prefill, and pi-Soft's positions at the assumed forward speed."""
    methods = list(request.methods or attr.methods)
    seconds = REMOVAL_SECONDS_PER_STEP * attr.num_steps * (len(methods) + 1) if request.include_removal else 0.0
    if image:
        seconds += IMAGE_PREFILL_SECONDS
    if request.soft is not None:
        tokens = soft_cost(attr, methods, request.soft, request.steps, request.positions)["tokens"]
        seconds += tokens / ASSUMED_SPEED.forward_tokens_per_s
    return seconds
