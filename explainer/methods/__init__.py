"""Registry of attribution methods, found by name, and their options.

A method is named on the command line (and in the app) by a spec, `name` or `name:key=value:key=value`, e.g.
`macs:alpha=0.5` or `atman:fast=false:batch_size=4`; several are separated by commas. Options are the fields of the
method's config dataclass; values are converted to the field's type and validated by the config itself, and every
mistake is an `InputError` (or `UnknownMethodError`) that says what is allowed.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, UnknownMethodError
from .atman import AtMan, AtManConfig
from .attnlrp import AttnLRP, AttnLRPConfig
from .base import AttributionMethod, GenerationRun, ProgressFn, answer_logprobs
from .cost import Cost, CostRequest
from .grad_ellm import GradELLM, GradELLMConfig
from .input_x_gradient import InputXGradient, InputXGradientConfig
from .macs import MACS, MACSConfig
from .macs_calibrated import MACSCalibrated, MACSCalibratedConfig
from .random import RandomBaseline, RandomConfig
from .rollout import Rollout, RolloutConfig
from .sources import Sources, SourcesConfig

METHODS: dict[str, type[AttributionMethod]] = {
    MACS.name: MACS,
    MACSCalibrated.name: MACSCalibrated,
    Rollout.name: Rollout,
    AtMan.name: AtMan,
    AttnLRP.name: AttnLRP,
    GradELLM.name: GradELLM,
    InputXGradient.name: InputXGradient,
    RandomBaseline.name: RandomBaseline,
    Sources.name: Sources,
}


def available_methods() -> list[str]:
    return list(METHODS)


def method_choices(image: bool = False) -> list[str]:
    """The methods a front end offers (the CLI's help, the app's checkboxes), in registry order: all of them, or with
    `image` only those that explain image prompts (`AttributionMethod.explains_images`)."""
    return [name for name, cls in METHODS.items() if cls.explains_images or not image]


@dataclass(frozen=True)
class MethodOption:
    """One option of a method: a field of its config dataclass.

    Attributes:
        name: the field name (the `key` of `name:key=value`).
        type: bool, int, float or str.
        default: the config's default.
        choices: the allowed values of a str option that has a fixed set, else None.
    """

    name: str
    type: type
    default: Any
    choices: tuple[str, ...] | None = None


def method_class(name: str) -> type[AttributionMethod]:
    """The registered class of `name` (case and surrounding spaces ignored).

    Raises:
        UnknownMethodError: the name is not registered; the message lists the valid ones.
    """
    key = name.strip().lower()
    if key not in METHODS:
        raise UnknownMethodError(f"Unknown method {name!r}. Available methods: {', '.join(METHODS)}.")
    return METHODS[key]


def method_options(name: str) -> list[MethodOption]:
    """The options of a registered method, in the order of its config's fields."""
    config = method_class(name).Config
    hints = typing.get_type_hints(config)
    return [
        MethodOption(
            f.name, hints[f.name], f.default, tuple(f.metadata["choices"]) if "choices" in f.metadata else None
        )
        for f in dataclasses.fields(config)
    ]


def _convert(method: str, option: MethodOption, value: Any) -> Any:
    where = f"{method}:{option.name}"
    if isinstance(value, str) and option.type is not str:
        text = value.strip().lower()
        if option.type is bool:
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise InputError(f"Option {where} is true or false, got {value!r}.")
            return text in ("true", "1", "yes")
        try:
            return option.type(text)
        except ValueError:
            raise InputError(f"Option {where} must be a number ({option.type.__name__}), got {value!r}.") from None
    if option.type is bool and not isinstance(value, bool):
        raise InputError(f"Option {where} is true or false, got {value!r}.")
    if option.type in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise InputError(f"Option {where} must be a number ({option.type.__name__}), got {value!r}.")
    if option.type is int and isinstance(value, float):
        if not value.is_integer():
            raise InputError(f"Option {where} must be a whole number, got {value!r}.")
        value = int(value)
    if option.type is float:
        value = float(value)
    if option.choices is not None and value not in option.choices:
        raise InputError(f"Option {where} must be one of {', '.join(option.choices)}, got {value!r}.")
    return value


def method_config(name: str, **options: Any) -> Any:
    """The config of a registered method with `options` converted and validated.

    Raises:
        UnknownMethodError: unknown method. InputError: unknown option, wrong type or value out of range.
    """
    cls = method_class(name)
    known = {o.name: o for o in method_options(name)}
    values = {}
    for key, value in options.items():
        if key not in known:
            raise InputError(f"Unknown option {key!r} for {cls.name}; its options: {', '.join(known) or 'none'}.")
        values[key] = _convert(cls.name, known[key], value)
    try:
        return cls.Config(**values)
    except (ValueError, TypeError) as e:
        raise InputError(f"Bad options for {cls.name}: {e}") from e


def get_method(name: str, config: Any = None, **options: Any) -> AttributionMethod:
    """Instantiate a registered method, from a config object or validated keyword options.

    Raises:
        UnknownMethodError: the name is not registered; the message lists the valid ones.
        InputError: an option is unknown, of the wrong type or out of range.
    """
    cls = method_class(name)
    if config is not None and options:
        raise TypeError("pass either a config object or keyword options, not both")
    return cls(config if config is not None else method_config(name, **options))


def parse_method_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`name:key=value:key=value` -> (name, {key: value-text}); the name is checked, the values are not yet."""
    name, *pairs = spec.strip().split(":")
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"Method option {pair!r} in {spec!r} must look like key=value.")
        options[key.strip()] = value.strip()
    return method_class(name).name, options


def method_from_spec(spec: str) -> AttributionMethod:
    """A method from `name` or `name:key=value:key=value` (e.g. `atman:fast=false` for AtMan's naive loop)."""
    name, options = parse_method_spec(spec)
    return get_method(name, **options)


def parse_methods(text: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Comma-separated specs -> (method names in order, {name: validated options}) for `explain` and `eval`.

    Raises:
        InputError: no method, an option error, or one method given twice with different options.
    """
    names: list[str] = []
    options: dict[str, dict[str, Any]] = {}
    for spec in (s for s in text.split(",") if s.strip()):
        name, raw = parse_method_spec(spec)
        config = method_config(name, **raw)
        chosen = {k: getattr(config, k) for k in raw}
        if name in options and options[name] != chosen:
            raise InputError(f"{name} is given twice with different options; give it once.")
        if name not in options:
            names.append(name)
        options[name] = chosen
    if not names:
        raise InputError(f"Give at least one method, e.g. macs. Available methods: {', '.join(METHODS)}.")
    return names, {n: o for n, o in options.items() if o}


__all__ = [
    "METHODS",
    "AtMan",
    "AtManConfig",
    "AttnLRP",
    "AttnLRPConfig",
    "GradELLM",
    "GradELLMConfig",
    "InputXGradient",
    "InputXGradientConfig",
    "MACS",
    "MACSConfig",
    "MACSCalibrated",
    "MACSCalibratedConfig",
    "RandomBaseline",
    "RandomConfig",
    "Rollout",
    "RolloutConfig",
    "Sources",
    "SourcesConfig",
    "AttributionMethod",
    "Cost",
    "CostRequest",
    "GenerationRun",
    "answer_logprobs",
    "ProgressFn",
    "MethodOption",
    "available_methods",
    "method_choices",
    "method_class",
    "get_method",
    "method_config",
    "method_from_spec",
    "method_options",
    "parse_method_spec",
    "parse_methods",
]
