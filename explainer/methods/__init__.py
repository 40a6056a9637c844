"""Registry of attribution methods, found by name."""

from __future__ import annotations

from typing import Any

from ..errors import UnknownMethodError
from .atman import AtMan, AtManConfig
from .base import AttributionMethod, GenerationRun, ProgressFn
from .macs import MACS, MACSConfig
from .random import RandomBaseline, RandomConfig
from .rollout import Rollout, RolloutConfig

METHODS: dict[str, type[AttributionMethod]] = {
    MACS.name: MACS,
    Rollout.name: Rollout,
    AtMan.name: AtMan,
    RandomBaseline.name: RandomBaseline,
}


def available_methods() -> list[str]:
    return list(METHODS)


def get_method(name: str, config: Any = None, **options: Any) -> AttributionMethod:
    """Instantiate a registered method.

    Raises:
        UnknownMethodError: the name is not registered; the message lists the valid ones.
    """
    key = name.strip().lower()
    if key not in METHODS:
        raise UnknownMethodError(f"Unknown method {name!r}. Available methods: {', '.join(METHODS)}.")
    return METHODS[key](config, **options)


__all__ = [
    "METHODS",
    "AtMan",
    "AtManConfig",
    "MACS",
    "MACSConfig",
    "RandomBaseline",
    "RandomConfig",
    "Rollout",
    "RolloutConfig",
    "AttributionMethod",
    "GenerationRun",
    "ProgressFn",
    "available_methods",
    "get_method",
]
