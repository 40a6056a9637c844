"""Which answer step a view shows: the one clamping rule every view follows, and where a finished answer opens.

Steps are 0-based indices into the generated tokens, as everywhere in the library.
"""

from __future__ import annotations

from .attribution import Attribution
from .spans import is_special


def clamp_step(step: int | None, num_steps: int) -> int | None:
    """The 0-based answer step a view shows for a requested `step`, the one rule every view and the app follow.

    Args:
        step: 0-based step; None means the newest. Values past either end are clamped (a slider or an API caller
            may send any whole number).
        num_steps: K, the steps there are.

    Returns:
        An int in [0, K - 1], or None when there are no steps.
    """
    if num_steps <= 0:
        return None
    if step is None:
        return num_steps - 1
    return min(max(int(step), 0), num_steps - 1)


def last_content_step(attr: Attribution) -> int | None:
    """The step a finished answer opens on: its last content token, not a trailing end-of-sequence token.

    Trailing special tokens (`<|im_end|>`, `</s>`, `<|endoftext|>`) and whitespace-only tokens are skipped; an answer
    made of nothing else opens on its last step.

    Returns:
        A 0-based step in [0, K - 1], or None when the answer has no tokens.
    """
    tokens = attr.generated_tokens[: attr.num_steps]
    for k in range(len(tokens) - 1, -1, -1):
        if tokens[k].strip() and not is_special(tokens[k]):
            return k
    return clamp_step(None, attr.num_steps)
