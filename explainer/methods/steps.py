"""The gradient methods' `steps` option: which answer steps to explain (one backward pass each; the other steps' rows
stay 0), so that a long answer's few tokens of interest, or a benchmark's scored steps, cost only their passes."""

from __future__ import annotations

from dataclasses import field
from typing import Any

STEPS_HELP = "answer steps explained, 1-based, e.g. '5-11' or '3 7-9'; empty: every step"
MAX_STEP = 1024  # no answer has more steps (`models.answer.MAX_NEW_TOKENS_LIMIT`)


def parse_steps(spec: str) -> tuple[int, ...]:
    """The 1-based answer steps of a gradient method's `steps` option, in order without repeats: "" (every step,
    returned as ()) or steps and ranges separated by spaces, e.g. "5-11" or "3 7-9", each within 1 to `MAX_STEP`.

    Raises:
        ValueError: anything else (the message says the form; a visitor's text is only quoted, never expanded).
    """
    steps: list[int] = []
    for part in spec.split():
        low, dash, high = part.partition("-")
        well_formed = low.isdigit() and (high.isdigit() or not dash) and len(low) <= 4 and len(high) <= 4
        if not well_formed or not 1 <= int(low) <= int(high or low) <= MAX_STEP:
            shown = spec if len(spec) <= 40 else spec[:40] + "..."
            raise ValueError(f"steps must be 1-based steps and ranges separated by spaces, each within 1-{MAX_STEP} "
                             f"(e.g. '5-11' or '3 7-9'), got {shown!r}")  # fmt: skip
        steps.extend(range(int(low), int(high or low) + 1))
    return tuple(dict.fromkeys(steps))


def chosen_steps(spec: str, k_total: int) -> list[int] | None:
    """The 0-based steps of K that a `steps` option explains; None: every step. Steps beyond K are left out (an
    answer may end sooner than the option foresaw)."""
    steps = parse_steps(spec)
    return None if not steps else sorted(k - 1 for k in steps if k <= k_total)


def steps_option() -> Any:
    """The `steps` field of a gradient method's config (a text; validate it with `parse_steps` in `__post_init__`)."""
    return field(default="", metadata={"help": STEPS_HELP})
