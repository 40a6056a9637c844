"""Widget values checked as a visitor or an API caller may send them: a clear `InputError` naming the widget."""

from __future__ import annotations

import math
from typing import Any

from explainer.errors import InputError
from explainer.result.spans import GRANULARITIES

# Slider bounds, (min, max): handlers refuse values outside them with a message (API callers can send anything).
NEW_TOKENS = (1, 256)  # text tab: max new tokens
IMAGE_NEW_TOKENS = (1, 128)  # image tab: max new tokens
IMAGE_TOKENS = (16, 1024)  # image tab: image detail (merged image tokens)


def number(value: Any, label: str) -> float:
    """A widget's value as a finite number."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{label} must be a number, got {value!r:.40}.") from None
    if not math.isfinite(x):
        raise InputError(f"{label} must be a finite number, got {value!r:.40}.")
    return x


def whole(value: Any, label: str, bounds: tuple[int, int]) -> int:
    """A slider's value as a whole number within its (min, max) bounds; API callers can send anything (3.0 is 3,
    2.5 is refused: rounding it would run a request nobody asked for)."""
    x = number(value, label)
    lo, hi = bounds
    if not lo <= x <= hi:
        raise InputError(f"{label} must lie between {lo} and {hi}, got {value!r:.40}.")
    if not x.is_integer():
        raise InputError(f"{label} must be a whole number between {lo} and {hi}, got {value!r:.40}.")
    return int(x)


def fraction(value: Any, label: str) -> float:
    """A value in [0, 1] (e.g. an opacity); numbers outside are clamped."""
    return min(max(number(value, label), 0.0), 1.0)


def step_index(step: Any) -> int | None:
    """0-based step from a 1-based step slider (None: the newest); the views clamp it to the steps there are."""
    return None if step is None else round(number(step, "The generation step")) - 1


def granularity(value: Any) -> str:
    """Prompt units: "token" (also for an empty value), "word" or "sentence"."""
    value = value or "token"
    if value not in GRANULARITIES:
        raise InputError(f"Prompt units must be one of {', '.join(GRANULARITIES)}, got {value!r:.40}.")
    return value


def answer_text(answer: Any) -> str | None:
    """The answer box's text, or None to generate (empty or whitespace only, as the library reads it)."""
    if answer is None:
        return None
    if not isinstance(answer, str):
        raise InputError(f"The answer must be text, got {type(answer).__name__}.")
    return answer if answer.strip() else None


def chosen_methods(methods: Any) -> list[str]:
    """The ticked methods, at least one."""
    methods = list(methods or [])
    if not methods:
        raise InputError("Select at least one attribution method.")
    return methods
