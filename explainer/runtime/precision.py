"""The model's floating-point precision: parsing `--dtype` / `EXPLAINER_DTYPE`, the default per device, its name.

One place for the rule that `auto` follows (`default_dtype`), so every entry point (CLI commands, bench workers, the
app) loads a model in the same precision for the same device: bfloat16 on an accelerator and on a CPU that computes
bfloat16 natively (`cpu_has_native_bf16`), float32 on other CPUs (their emulated bf16 makes a prefill several times
slower, docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import InputError

DTYPES: dict[str, torch.dtype] = {  # the values `--dtype` and EXPLAINER_DTYPE accept, besides "auto"
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DTYPE_CHOICES = ("auto", *DTYPES)
CPUINFO = "/proc/cpuinfo"  # where the CPU's flags are read (tests point it at a file of their own)


def parse_dtype(text: str | None) -> torch.dtype | None:
    """The dtype named by `text` (case and surrounding spaces ignored); None for "auto", "" or None.

    None means "the default for the device" (`default_dtype`), which only the loader knows.

    Raises:
        InputError: any other value; the message lists the valid ones.
    """
    if text is None:
        return None
    key = str(text).strip().lower()
    if key in ("", "auto"):
        return None
    if key not in DTYPES:
        raise InputError(f"Unknown dtype {text!r}: use one of {', '.join(DTYPE_CHOICES)}.")
    return DTYPES[key]


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes bfloat16 natively (the `avx512_bf16` or `amx_bf16` flag in `cpuinfo`, by default
    `CPUINFO`); without, bf16 matmuls are emulated and a prefill is several times slower than in float32."""
    try:
        with open(cpuinfo or CPUINFO) as f:
            text = f.read()
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", text) is not None


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The precision `auto` stands for on `device`: bfloat16 on an accelerator and on a CPU with native bf16
    (`cpu_has_native_bf16`), float32 on other CPUs."""
    if torch.device(device).type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a dtype ("bfloat16" for torch.bfloat16), as `parse_dtype` reads it back."""
    return str(dtype).removeprefix("torch.")


def model_dtype(model: Any) -> torch.dtype | None:
    """The floating-point dtype of a model's weights (its first floating parameter), or None if it has none."""
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    parameters = getattr(model, "parameters", None)
    for p in parameters() if callable(parameters) else ():
        if p.is_floating_point():
            return p.dtype
    return None


def precision_label(model: Any) -> str:
    """E.g. "bfloat16 on cpu": the weights' dtype and the device of the first weight; "" for an object without any."""
    dtype = model_dtype(model)
    if dtype is None:
        return ""
    device = getattr(model, "device", None)
    if not isinstance(device, torch.device):
        device = next(p.device for p in model.parameters() if p.is_floating_point())
    return f"{dtype_name(dtype)} on {device}"


def precision_meta(model: Any) -> dict[str, str]:
    """{"dtype": "bfloat16", "device": "cuda:0"} of a model's weights, for a result's metadata ({} without weights)."""
    label = precision_label(model)
    if not label:
        return {}
    dtype, _, device = label.partition(" on ")
    return {"dtype": dtype, "device": device}


@contextlib.contextmanager
def without_cuda_autocast(device: torch.device) -> Iterator[None]:
    """Within the block, `torch.cuda.amp.autocast()` opens no autocast region on a CUDA `device` (elsewhere nothing
    changes). For a peer package that wraps its own passes in it: ContextCite's ablations then run in float16 on a GPU
    and in float32 on a CPU. The LDS table compares it with this project's methods in one precision, the model's, so
    its GPU rows must not change arithmetic with the machine. The attribute is restored when the block ends."""
    if torch.device(device).type != "cuda":
        yield
        return
    original = torch.cuda.amp.autocast
    torch.cuda.amp.autocast = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.amp.autocast = original
