"""One faithfulness measurement as one object: what to measure on a result, checked once when it is built.

`measure_faithfulness` and `stream_faithfulness` take it whole, and it travels unchanged to the worker thread. What
depends on the result (positions inside its prompt, steps inside its answer, the methods it has scores for) is
checked against the result when the measurement starts.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from .removal import RemovalConfig
from .soft import QUICK_SOFT, SoftConfig


def _whole(value: Any) -> int:
    if isinstance(value, bool):  # True is an int to Python, not a position to a user
        raise TypeError
    return operator.index(value)


def _indices(values: Sequence[int] | None, what: str) -> tuple[int, ...] | None:
    """A tuple of non-negative whole numbers, or None; `what` names them in the error."""
    if values is None:
        return None
    try:
        if isinstance(values, str | bytes):
            raise TypeError
        out = tuple(_whole(v) for v in values)
    except TypeError:
        raise InputError(f"{what} must be a list of whole numbers, got {values!r:.60}.") from None
    if not out:
        raise InputError(f"{what} are empty: give at least one, or None for the default.")
    if min(out) < 0:
        raise InputError(f"{what} are 0-based and cannot be negative, got {min(out)}.")
    return out


@dataclass(frozen=True)
class FaithfulnessRequest:
    """What to measure on one result: removal curves (MIF / LIF / SRG), pi-Soft, or both.

    Attributes:
        methods: methods of the result to evaluate (None: all it has); "random" needs no scores, and the removal
            curves add it as their baseline.
        positions: 0-based prompt positions that may be removed or masked (None: the user's text).
        removal: the removal curves' settings.
        soft: pi-Soft's settings; None skips pi-Soft.
        include_removal: False skips the removal curves.
        steps: 0-based answer steps pi-Soft evaluates (None: every `soft.step_stride`-th); only with `soft`.
        image_inputs: an image result's `vision.encode_image_prompt(...).prefill_inputs` (its removal curves need
            them; pi-Soft is measured on text prompts only, so `soft` must then be None).
    """

    methods: tuple[str, ...] | None = None
    positions: tuple[int, ...] | None = None
    removal: RemovalConfig = field(default_factory=RemovalConfig)
    soft: SoftConfig | None = QUICK_SOFT
    include_removal: bool = True
    steps: tuple[int, ...] | None = None
    image_inputs: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # tensors: not compared

    def __post_init__(self) -> None:
        if self.methods is not None:
            if isinstance(self.methods, str) or not all(isinstance(m, str) and m for m in self.methods):
                raise InputError(f"methods must be a list of method names, got {self.methods!r:.60}.")
            if not self.methods:
                raise InputError("No methods to measure: choose at least one, or None for every method of the result.")
            object.__setattr__(self, "methods", tuple(dict.fromkeys(self.methods)))
        object.__setattr__(self, "positions", _indices(self.positions, "Evaluated positions"))
        object.__setattr__(self, "steps", _indices(self.steps, "pi-Soft's steps"))
        if not isinstance(self.removal, RemovalConfig):
            raise InputError(f"removal must be a RemovalConfig, got {type(self.removal).__name__}.")
        if self.soft is not None and not isinstance(self.soft, SoftConfig):
            raise InputError(f"soft must be a SoftConfig or None, got {type(self.soft).__name__}.")
        if not self.include_removal and self.soft is None:
            raise InputError("Nothing to measure: the removal curves are off and pi-Soft is off (soft=None).")
        if self.steps is not None and self.soft is None:
            raise InputError("steps pick the answer steps pi-Soft evaluates, but pi-Soft is off (soft=None).")
        if self.image_inputs is not None and self.soft is not None:
            raise InputError("pi-Soft is measured on text prompts only: an image result's request needs soft=None.")
        if self.image_inputs is not None and not self.include_removal:
            raise InputError("image_inputs are for the removal curves, which this request skips.")
