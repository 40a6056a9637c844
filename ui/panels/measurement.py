"""The faithfulness panel's widgets read into one `FaithfulnessRequest`, in one place.

The panel's handler (`ui/panels/faithfulness.py`) runs the request this builds, and `gpu_time.faithfulness_seconds`
sizes the ZeroGPU call from the same request, so the two cannot read the widgets differently.
"""

from __future__ import annotations

from typing import Any

from explainer.errors import InputError
from explainer.faithfulness import QUICK_SOFT, FaithfulnessRequest
from explainer.faithfulness.common import RANKED, image_ranked_positions
from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step

from ..guards import inputs

SOFT_CHOICES = ("the step on the slider", "every 5th step", "skip π-Soft")


def is_image_result(result: Any) -> bool:
    """Whether `result` is an image tab's result (`image_tab.ImageResult`, which holds its `Attribution` as `attr`)."""
    return isinstance(getattr(result, "attr", None), Attribution)


def measured(result: Any) -> Attribution | None:
    """The `Attribution` a text or image tab's result holds (None when there is none)."""
    return result.attr if is_image_result(result) else result


def soft_steps(result: Attribution, choice: str, step: float | None) -> list[int] | None | bool:
    """0-based steps for pi-Soft from the panel's choice: [the slider's step], None (every 5th) or False (skip)."""
    if choice == SOFT_CHOICES[2]:
        return False
    if choice == SOFT_CHOICES[1]:
        return None
    return [clamp_step(inputs.step_index(step), result.num_steps)]


def faithfulness_request(
    result: Any, methods: list[str] | None, soft_choice: str = SOFT_CHOICES[0], step: float | None = None,
    rank: str = RANKED[0],
) -> FaithfulnessRequest:  # fmt: skip
    """The request the panel's widgets ask for on the session's result.

    Args:
        result: the text tab's `Attribution` or the image tab's `ImageResult`.
        methods: the checked methods; those the result has scores for are measured.
        soft_choice: one of `SOFT_CHOICES` (text results; an image result skips pi-Soft).
        step: the step slider (1-based; None: the newest).
        rank: an image result's ranked tokens, one of `common.RANKED`.

    Returns:
        The request; an image result's leaves out its prompt inputs (`image_inputs`), which the handler encodes once
        the request is known to be good (a cost estimate needs none).

    Raises:
        InputError: no answer yet, no chosen method of the result, or an unknown `rank`.
    """
    attr = measured(result)
    if attr is None or not attr.num_steps:
        raise InputError("Generate an answer first: faithfulness is measured on the current result.")
    chosen = [m for m in (methods or []) if m in attr.methods]
    if not chosen:
        raise InputError("Select at least one attribution method that was run for this answer, then measure again.")
    if is_image_result(result):  # its image tokens ranked; pi-Soft is measured on text prompts only
        return FaithfulnessRequest(methods=chosen, positions=image_ranked_positions(attr, rank), soft=None)
    steps = soft_steps(attr, soft_choice, step)
    return FaithfulnessRequest(methods=chosen, soft=None if steps is False else QUICK_SOFT, steps=steps or None)
