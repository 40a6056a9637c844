"""Which models fit: a model's memory counted from its configuration before loading, and the app's defaults chosen
by the memory and time budget of the hardware.

A model's resident memory is its parameters (counted on the `meta` device, so nothing is allocated) times the bytes
per parameter, plus `ACTIVATIONS` of that for one request at the default sizes and `ALLOWANCE` for the runtime.
`load_model` refuses a model that does not fit what is free (`memory.available_bytes`, the cgroup limit included)
before it reads a weight. The defaults' configurations ship with the package (`explainer/data/configs`), so the app
decides without a download.

The defaults (`choose_defaults`) come from measurements with real-size random-weight models on 2-vCPU machines
(`scripts/real_size.py`, docs/deployment.md, which says which kind of CPU each row came from). On a CPU with native
bf16 (avx512_bf16 / amx_bf16) the mission's Qwen2.5-VL-3B runs in bfloat16 at 256 image tokens (an image question
in 17-34 s depending on the CPU, 8 GB); on a CPU without it bfloat16 is ~5x slower than float32 and Qwen2.5-VL-3B
takes 15 GB in float32, so the image model there is Qwen2-VL-2B in float32 with a smaller image budget; on a GPU the
larger ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from .memory import MemoryLimitError, available_bytes, format_bytes

ALLOWANCE = 500_000_000  # bytes beyond the weights: torch and Python, the tokenizer
ACTIVATIONS = 0.10  # share of the weights' bytes added for one request's activations (measured: docs/deployment.md)
ROOM = 0.85  # share of the free memory the models may take (the rest: requests, the OS, the web server)

TEXT_CPU = "Qwen/Qwen2.5-0.5B-Instruct"
TEXT_GPU = "Qwen/Qwen2.5-1.5B-Instruct"
VISION_CPU = "Qwen/Qwen2-VL-2B-Instruct"
VISION_GPU = "Qwen/Qwen2.5-VL-3B-Instruct"
TEXT_CPU_BF16 = TEXT_CPU  # native bf16 CPU: 32 tokens in 4.7 s (1.5B: 11.4 s; docs/deployment.md)
CPU_IMAGE_TOKENS = 64  # merged image tokens on a CPU without native bf16 (about 224 x 224 pixels): ~16 s a question
GPU_IMAGE_TOKENS = 256  # on a GPU, and on a CPU with native bf16 (Qwen2.5-VL-3B in bf16: 17-34 s a question)


def default_image_tokens(gpu: bool, native_bf16: bool = False) -> int:
    """The image budget a visitor starts with: `GPU_IMAGE_TOKENS` on a GPU or a CPU with native bf16,
    `CPU_IMAGE_TOKENS` on other CPUs."""
    return GPU_IMAGE_TOKENS if gpu or native_bf16 else CPU_IMAGE_TOKENS


def bundled_config(model_id: str) -> Any | None:
    """The shipped configuration of a default model (by its Hub id's last part), or None."""
    from transformers import AutoConfig

    name = model_id.rstrip("/").rsplit("/", 1)[-1]
    path = resources.files("explainer") / "data" / "configs" / f"{name}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return AutoConfig.for_model(data.pop("model_type"), **data)


def parameter_count(config: Any) -> int:
    """Parameters of the model `config` describes, counted on the meta device (tied weights once)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cls = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(config)
    return sum(p.numel() for p in model.parameters())


def model_bytes(config: Any, dtype: torch.dtype) -> int:
    """Resident memory of the model loaded in `dtype` and running a request: weights, `ACTIVATIONS` of them, and
    `ALLOWANCE`."""
    weights = parameter_count(config) * torch.empty((), dtype=dtype, device="meta").element_size()
    return int(weights * (1 + ACTIVATIONS)) + ALLOWANCE


def check_model_fits(name: str, config: Any, dtype: torch.dtype, device: torch.device, held: int = 0) -> None:
    """Refuse, before loading, a model that needs more than `ROOM` of the free memory of `device` (less `held`
    bytes of models already counted but not yet loaded).

    Raises:
        MemoryLimitError: names the model, its need, the memory free and what to do.
    """
    free = available_bytes(device)
    if free is None:
        return
    need = model_bytes(config, dtype)
    limit = int(ROOM * free) - held
    if need <= limit:
        return
    dtype_name = str(dtype).removeprefix("torch.")
    raise MemoryLimitError(
        f"Model {name!r} needs about {format_bytes(need)} in {dtype_name} on {device.type} (its parameters and "
        "what running it takes), but only {format_bytes(max(0, limit))} of the "
        f"{format_bytes(free)} free may be used. Choose a smaller model"
        f"{', or bfloat16 (EXPLAINER_DTYPE=bfloat16)' if dtype == torch.float32 else ''}, or hardware with more "
        "memory."
    )


@dataclass(frozen=True)
class Defaults:
    """The app's models when none is set: ids (None: none), the dtype name, the image budget and why."""

    text: str | None
    vision: str | None
    dtype: str
    max_image_tokens: int
    reason: str


def choose_defaults(free: int | None, gpu: bool, native_bf16: bool = False) -> Defaults:
    """The default models for hardware with `free` bytes of (GPU or CPU) memory.

    GPU: Qwen2.5-1.5B and Qwen2.5-VL-3B in bfloat16, 256 image tokens. CPU with native bf16: `TEXT_CPU_BF16` and
    Qwen2.5-VL-3B in bfloat16, 256 image tokens. Other CPUs: Qwen2.5-0.5B and Qwen2-VL-2B in float32, 64 image
    tokens. When both do not fit, the vision-language model alone serves both tabs; when even that does not fit,
    the text model alone.
    """
    if gpu:
        text, vision, dtype, image_tokens = TEXT_GPU, VISION_GPU, torch.bfloat16, GPU_IMAGE_TOKENS
    elif native_bf16:
        text, vision, dtype, image_tokens = TEXT_CPU_BF16, VISION_GPU, torch.bfloat16, GPU_IMAGE_TOKENS
    else:
        text, vision, dtype, image_tokens = TEXT_CPU, VISION_CPU, torch.float32, CPU_IMAGE_TOKENS
    need = {m: model_bytes(bundled_config(m), dtype) for m in (text, vision)}
    where = "GPU" if gpu else "CPU"
    name = str(dtype).removeprefix("torch.")
    if free is None or need[text] + need[vision] <= ROOM * free:
        return Defaults(text, vision, name, image_tokens, f"both fit the {where} memory in {name}")
    if need[vision] <= ROOM * free:
        return Defaults(vision, vision, name, image_tokens, f"one vision-language model serves both tabs ({where})")
    return Defaults(text, None, name, image_tokens, f"no vision-language model fits the {where} memory")
