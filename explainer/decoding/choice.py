"""Which decode path a request takes, and why: `choose_path`, the one place that decides, and the one variable that
overrides it, `EXPLAINER_DECODE`.

A path is a place and a form of the step (docs/architecture.md draws them as two axes):

| | dynamic | fixed shape, eager | fixed shape, CUDA graph |
|---|---|---|---|
| alone | `solo` (`solo.py`) | `static` (`static.py`) | `cuda-graph` (`static.py`) |
| in the batch (`batched`) | row by row (a CPU) | the fixed-shape step | one graph per slot state (CUDA) |

The choice (`DecodeChoice`: path, reason, form) is made once per request and passed down to the scheduler that
runs it; none asks again. It goes into the result once, `meta["decode"] = {path, reason, batch_size,
prefill_rows}`, and each `Step` carries its path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError
from ..methods import method_class
from ..runtime.devices import input_device, spread_over_devices
from ..runtime.memory import language_config
from ..runtime.session import holds
from .graphs import graph_failure

DECODE_ENV = "EXPLAINER_DECODE"
SOLO, STATIC, CUDA_GRAPH, BATCHED = "solo", "static", "cuda-graph", "batched"  # the paths
PATHS = (SOLO, STATIC, CUDA_GRAPH, BATCHED)
DYNAMIC, FIXED_SHAPE, GRAPH = "dynamic", "fixed-shape", "graph"  # the forms of a step
FORMS = (DYNAMIC, FIXED_SHAPE, GRAPH)
# The values of $EXPLAINER_DECODE: a path, or "auto"; "auto" and "batched" may name the batch's form after a colon
# ("batched:fixed-shape": the batch's fixed-shape step, eagerly, on a CPU too).
OVERRIDES = ("auto", *PATHS)
RENAMED = {"static-eager": STATIC}  # earlier names still read

_batching = False  # whether text requests of this process join the batched decode (`enable_batching`)


@dataclass(frozen=True)
class DecodeChoice:
    """The path a request's decode takes (one of `PATHS`), why, in words a person can act on, and the form of its
    step (one of `FORMS`: `dynamic` for `solo` and the batch's rows apart, `fixed-shape` for `static` and the batch's
    eager fixed-shape step, `graph` for `cuda-graph` and the batch's CUDA graphs)."""

    path: str
    reason: str
    form: str = DYNAMIC

    @property
    def graphs(self) -> bool:
        """Whether the step is recorded as a CUDA graph and replayed (`graphs.StepGraph`)."""
        return self.form == GRAPH

    def meta(self, batch_size: int = 1, prefill_rows: int = 1) -> dict[str, Any]:
        """What `meta["decode"]` keeps: the path, the reason, the most rows a step shared (`batch_size`) and how many
        rows with this prompt shared its prefill pass (`prefill_rows`); 1 and 1 off the batched path."""
        return {"path": self.path, "reason": self.reason, "batch_size": batch_size, "prefill_rows": prefill_rows}

    def eager(self, why: str | None) -> DecodeChoice:
        """The choice after this request's graph capture failed (`graphs.graph_failure` says `why`): the same step,
        eagerly."""
        path = STATIC if self.path == CUDA_GRAPH else self.path
        return DecodeChoice(path, f"CUDA graph capture failed: {why}", FIXED_SHAPE)


def enable_batching(on: bool = True) -> None:
    """Let text requests of this process join the batched decode (the app turns it on; library callers opt in).
    Off, every request holds the model from its first forward pass to its last, one after the other."""
    global _batching
    _batching = bool(on)


def batching_enabled() -> bool:
    return _batching


def solo_reason(model: torch.nn.Module, images: bool = False) -> str | None:
    """Why a request on `model` can take neither the static nor the batched path, or None when it may (an image
    prompt may take the static path: `batch_reason`)."""
    config = language_config(model)
    vision = config is not model.config or getattr(model.config, "vision_config", None) is not None
    if vision and not images:  # no explicit 3-D positions: the model would keep its own position state
        return "vision-language model with a text prompt: runs the solo loop"
    types = getattr(config, "layer_types", None) or []
    if getattr(config, "sliding_window", None) or any(t != "full_attention" for t in types):
        return "sliding-window layers: their window is measured in cache positions"
    if spread_over_devices(model) or len({p.device for p in model.parameters()}) > 1:
        return "model spread over several devices (device map)"
    return None


def batch_reason(images: bool) -> str | None:
    """Why a request cannot join the batched decode (beyond `solo_reason`), or None when it can."""
    if images:
        return "image prompt: the batched decode takes text prompts only"
    return None


def static_reason(model: torch.nn.Module, streaming: Sequence[Any]) -> str | None:
    """Why the static step cannot run this request (beyond `solo_reason`), or None when it can. `streaming`: the
    streaming methods, instances or classes (their `has_device_step` flag is read)."""
    others = [m.name for m in streaming if not m.has_device_step]
    if others:
        return f"{', '.join(others)} has no device step: runs the solo loop"
    if not getattr(model, "_can_compile_fullgraph", False):  # transformers' mark of models that run a static cache
        return f"{type(model).__name__} is not marked as working with a static cache"
    return None


def override() -> tuple[str, str | None]:
    """$EXPLAINER_DECODE, checked: (one of `OVERRIDES`, "auto" when unset; the batch's form asked after a colon, or
    None)."""
    value = (os.environ.get(DECODE_ENV) or "auto").strip().lower()
    path, _, form = value.partition(":")
    path = RENAMED.get(path, path)
    if path not in OVERRIDES or (form and (form not in FORMS or path not in ("auto", BATCHED))):
        raise InputError(
            f"{DECODE_ENV} must be one of {', '.join(OVERRIDES)} (auto and batched may add the batch's form: "
            f"{', '.join(f'batched:{f}' for f in FORMS)}), got {value!r}."
        )
    return path, form or None


def choose_path(
    bundle: Any, request: Any, *, device: torch.device | None = None, can_batch: bool | None = None
) -> DecodeChoice:
    """The path a request decodes on, why, and its step's form.

    By default (`EXPLAINER_DECODE` unset or "auto"): `batched` for a text request when batching is on
    (`enable_batching`, the app) and the caller does not hold the model; else on CUDA `cuda-graph` where the static
    step can run, image prompts included (`static` where a capture failed before); `solo` everywhere else. A path
    named in `EXPLAINER_DECODE` is forced wherever it can run (`cuda-graph` off CUDA runs `static`); where it cannot,
    `solo` runs and the reason says why.

    Args:
        bundle: the `ModelBundle`, or the model itself.
        request: an `ExplainRequest` (its images and methods are read) or a `DecodeJob` (its prefill inputs, methods
            and prompt's device).
        device: where the decode runs (default: the job's ids, else the model's input device).
        can_batch: whether the caller could follow a batched row (default: it does not hold the model).

    Raises:
        InputError: `EXPLAINER_DECODE` names no path.
    """
    forced, form = override()
    model = bundle if isinstance(bundle, torch.nn.Module) else bundle.model  # a causal LM has a `.model` too
    images, streaming, ids = _facts(request)
    device = device or (ids.device if ids is not None else input_device(model))
    can_batch = not holds(model) if can_batch is None else can_batch
    if forced == SOLO:
        return DecodeChoice(SOLO, f"{DECODE_ENV}=solo")
    why = solo_reason(model, images)
    if why is not None:
        return DecodeChoice(SOLO, why)
    if forced == BATCHED or (forced == "auto" and _batching):
        why = batch_reason(images)
        if can_batch and why is None:
            form, words = batch_step_form(model, device, form)
            return DecodeChoice(BATCHED, f"{_batched_why(forced)}: {words}", form)
        if forced == BATCHED:
            why = why or "this caller cannot follow a batched row (it holds the model: an evaluation)"
            return DecodeChoice(SOLO, why)
    cuda = device.type == "cuda"
    if forced in ("auto", BATCHED) and not cuda:
        return DecodeChoice(SOLO, "the CPU runs the plain loop (the static step is not faster there)")
    why = static_reason(model, streaming)
    if why is not None:
        return DecodeChoice(SOLO, why)
    if forced == STATIC or not cuda:
        return DecodeChoice(STATIC, f"{DECODE_ENV}={forced}: the static step, run eagerly", FIXED_SHAPE)
    failed = graph_failure(model)
    if failed is not None:
        return DecodeChoice(STATIC, f"CUDA graph capture failed before ({failed}): the step runs eagerly", FIXED_SHAPE)
    why = f"{DECODE_ENV}={CUDA_GRAPH}" if forced == CUDA_GRAPH else "CUDA: the step as one graph"
    return DecodeChoice(CUDA_GRAPH, why, GRAPH)


def _batched_why(forced: str) -> str:
    return f"{DECODE_ENV}=batched" if forced == BATCHED else "batching is on"


def batch_step_form(model: torch.nn.Module, device: torch.device, asked: str | None = None) -> tuple[str, str]:
    """How the batch runs its decode step (`batched/fixed.py`) on `device`: (form, in words). On CUDA the fixed-shape
    step as one graph (eagerly where a capture failed before); on a CPU row by row (`dynamic`), at the speed it had
    before. `asked`: the form `EXPLAINER_DECODE` names after a colon (a graph only on CUDA)."""
    cuda = device.type == "cuda"
    if asked == DYNAMIC or (asked is None and not cuda):
        return DYNAMIC, "the batch's step runs eagerly, row by row"
    failed = graph_failure(model) if cuda else "not on CUDA"
    if failed is not None or asked == FIXED_SHAPE:
        return FIXED_SHAPE, f"the batch's fixed-shape step runs eagerly ({failed or 'asked'})"
    return GRAPH, "the batch's step as one CUDA graph per slot state"


def _facts(request: Any) -> tuple[bool, list[Any], torch.Tensor | None]:
    """(image prompt?, the streaming methods (instances or classes), the prompt ids or None) of a request or job."""
    if hasattr(request, "input_ids"):  # a DecodeJob
        return bool(request.extra_inputs), [m for m in request.methods if m.streaming], request.input_ids
    methods = [method_class(m) if isinstance(m, str) else m for m in request.methods]
    return bool(request.images), [m for m in methods if m.streaming], None


def decode_record(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta["decode"]` as this version writes it, from a result of any version: before it, "decode" was "solo" or
    "batched", and the loop ("dynamic", "static", "cuda-graph"), batch size and shared prefill had keys of their own."""
    value = meta.get("decode")
    if isinstance(value, dict):
        return value
    path = meta.get("decode_path")
    path = BATCHED if value == "batched" else SOLO if path in (None, "dynamic") else path
    return {"path": path, "reason": "", "batch_size": meta.get("batch_size", 1),
            "prefill_rows": meta.get("prefill_rows", 1)}  # fmt: skip
