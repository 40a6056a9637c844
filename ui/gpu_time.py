"""How much GPU time each ZeroGPU call asks for: from the request's time estimate, not a constant.

`spaces.GPU(duration=...)` takes a function of the handler's own arguments; these are those functions, one per
handler that runs the model (`Components.bind(..., duration=...)`). They never run the model: the estimates use the
speed measured inside an earlier GPU call, or `estimate.ASSUMED_SPEED` until one has run
(`hardware.gpu_duration` adds the margin and the bounds). Asking too little stops a request midway; asking too much
spends the visitor's ZeroGPU quota, which counts the time asked for.
"""

from __future__ import annotations

from typing import Any

from explainer.errors import ExplainerError
from explainer.estimate import ASSUMED_SPEED, answer_steps, estimate
from explainer.faithfulness import FaithfulnessRequest, soft_cost
from explainer.faithfulness.common import RANKED
from explainer.methods import METHODS
from explainer.result.attribution import Attribution
from explainer.runtime.hardware import gpu_duration

from . import inputs, models
from .measurement import SOFT_CHOICES, faithfulness_request, is_image_result, measured
from .options import chosen_options

DECODE_TOKENS_PER_S = 10.0  # a GPU's greedy decoding with capture on, at worst (first request included)
IMAGE_PREFILL_SECONDS = 10.0  # vision tower and prefill of an image prompt
IMAGE_POST_HOC_SECONDS = 120.0  # AtMan on an image prompt: N suppression passes (no estimate for images yet)
REMOVAL_SECONDS_PER_STEP = 1.0  # removal curves: regenerations per answer token and method, on a GPU


def text_seconds(
    prompt: str, methods: list[str], max_new_tokens: float, chat_template: bool, show_all: bool = False,
    answer: str | None = None, span: bool = False, granularity: str = "token", *options: Any, **_: Any,
) -> int:  # fmt: skip
    """GPU seconds for the text tab's `explain` with these arguments: decoding K answer tokens (a given answer's
    tokens, else `max_new_tokens`) and each chosen method's extra time."""
    try:
        new = inputs.whole(max_new_tokens, "Max new tokens", inputs.NEW_TOKENS)
        given = inputs.answer_text(answer)
        bundle = models.get_bundle()
        figures = estimate(
            bundle, prompt, list(methods or []), max_new_tokens=new, chat_template=bool(chat_template),
            method_options=chosen_options(list(methods or []), options), answer=given, probe=False,
        )  # fmt: skip
        steps = answer_steps(bundle, given, new)
    except ExplainerError:
        return gpu_duration(None)  # a request the estimate refuses fails fast in the call itself
    extra = [e.seconds for e in figures if not e.cost.free]
    if any(s is None for s in extra):
        return gpu_duration(None)
    return gpu_duration(steps / DECODE_TOKENS_PER_S + sum(extra))


def image_seconds(
    image: Any, question: str, methods: list[str], max_new_tokens: float, opacity: Any = None, contour: Any = None,
    max_image_tokens: Any = None, answer: str | None = None, more_images: Any = None, *options: Any, **_: Any,
) -> int:  # fmt: skip
    """GPU seconds for the image tab's `explain_image`: prefill, decoding K answer tokens (a given answer's tokens,
    else `max_new_tokens`, at most the tab's `inputs.IMAGE_NEW_TOKENS`), and AtMan's passes when chosen."""
    try:
        new = inputs.whole(max_new_tokens, "Max new tokens", inputs.IMAGE_NEW_TOKENS)
        given = inputs.answer_text(answer)
        steps = answer_steps(models.get_vl_bundle(), given, new) if given else new
    except ExplainerError:
        return gpu_duration(None)  # as `text_seconds`
    post_hoc = [m for m in methods or [] if m in METHODS and not METHODS[m].streaming]
    return gpu_duration(IMAGE_PREFILL_SECONDS + steps / DECODE_TOKENS_PER_S + IMAGE_POST_HOC_SECONDS * len(post_hoc))


def faithfulness_seconds(
    result: Any, methods: list[str], metric: str = "", soft_choice: str = SOFT_CHOICES[0], step: Any = None,
    rank: str = RANKED[0],
    *_: Any, **__: Any,
) -> int:  # fmt: skip
    """GPU seconds for the faithfulness panel's `faithfulness` with these arguments: the request its handler builds
    from them (`measurement.faithfulness_request`), sized by `request_seconds`."""
    try:
        request = faithfulness_request(result, methods, soft_choice, step, rank)
    except (ExplainerError, ValueError):
        return gpu_duration(0)  # the handler refuses the same request at once
    try:
        return gpu_duration(request_seconds(measured(result), request, image=is_image_result(result)))
    except ExplainerError:
        return gpu_duration(None)


def request_seconds(attr: Attribution, request: FaithfulnessRequest, image: bool = False) -> float:
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
