"""Memory: what the device has free, what a request will need, and refusing one that will not fit before it runs.

A request (prompt of N tokens, up to K answer tokens, T = N + K) needs the generation's own memory plus what each
method keeps (`AttributionMethod.memory`, in bytes, from the model's shape alone):

- generation: the KV cache (2 x L x KV heads x head dim x T in the model's dtype), the prefill's activations (about
  T x (4 x hidden + 3 x intermediate) values at a time) and the captured attention rows (L x H x T float32, three
  times: the rows a decode path keeps, and a step's scores and probabilities of all layers from one product);
- Rollout: the head-fused attention of every prompt row, L x N^2 / 2 float32 values, and of the generated rows;
- Input x Gradient, AttnLRP, Grad-ELLM: one forward graph over T - 1 positions (each layer's activations, and where
  attention's backward keeps its weights, L x H x T^2 of them: eager attention, or an SDPA kernel that keeps them,
  `attention_keeps_weights`);
- AtMan: a prefix cache over T positions and one batch of `kv.batch_tokens` positions, with a cache copy per row
  (on an accelerator as many rows as `kv.batch_budget` sizes a pass to from its free memory);
- pi-Soft with fixed routing: the unperturbed attention weights, L x H x T^2 float32 (`faithfulness`).

The estimates are deliberately rough (within a factor of about two): they exist to refuse a request that would
certainly exhaust the memory, with a message that names the limit and what to do, instead of a crash or a killed
process minutes later.

What is free: on a GPU `torch.cuda.mem_get_info`; on a CPU the smaller of the kernel's MemAvailable and what the
container's cgroup limit leaves (v2 `memory.max` - `memory.current`, v1 `memory.limit_in_bytes` -
`memory.usage_in_bytes`). `EXPLAINER_MEMORY_BUDGET` (e.g. "6GB", "512MiB") caps it further.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from . import devices  # the module, not the name: tests pretend a GPU by patching it
from .hardware import zero_gpu

BUDGET_ENV = "EXPLAINER_MEMORY_BUDGET"
USABLE = 0.9  # share of the free memory a request may plan to use
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


class MemoryLimitError(InputError):
    """A request needs more memory than the device has free; raised before any work starts."""


def parse_bytes(text: str | int | float) -> int:
    """ "6GB", "512MiB", "1.5e9" or a number -> bytes.

    Raises:
        ValueError: not a size.
    """
    if isinstance(text, int | float):
        return int(text)
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a memory size: {text!r} (e.g. 6GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float) -> str:
    """Bytes as a short human-readable size, e.g. "1.6 GB"."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) and anything unreadable: None


def cgroup_memory_left(root: str | Path = "/sys/fs/cgroup") -> int | None:
    """Bytes the container's cgroup still allows (limit - usage), or None without a limit."""
    root = Path(root)
    for limit_file, usage_file in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes",
                                                                       "memory/memory.usage_in_bytes")):  # fmt: skip
        limit = _read_int(root / limit_file)
        if limit is not None and limit < 2**60:  # v1 writes "no limit" as a huge number
            return max(0, limit - (_read_int(root / usage_file) or 0))
    return None


def host_memory_available(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """The kernel's MemAvailable in bytes, or None where there is no /proc/meminfo."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def budget_cap() -> int | None:
    """`EXPLAINER_MEMORY_BUDGET` in bytes, or None when unset."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise InputError(f"{BUDGET_ENV}: {e}") from e


def available_bytes(device: torch.device | str) -> int | None:
    """Memory free for new work on `device` (see the module docstring); None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda" and zero_gpu() and not torch.cuda.is_initialized():
        free = None  # ZeroGPU's main process: the GPU is attached per call, and asking would initialise CUDA
    elif device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    elif device.type == "cpu":
        known = [b for b in (host_memory_available(), cgroup_memory_left()) if b is not None]
        free = min(known) if known else None
    else:
        free = None
    cap = budget_cap()
    if cap is not None:
        free = cap if free is None else min(free, cap)
    return free


def language_config(model: torch.nn.Module):
    """The config whose `_attn_implementation` the language model's attention layers read."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return text if text is not None else config


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimates read from a model's configuration (its language model's, for a VLM)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        c = language_config(model)
        heads = int(c.num_attention_heads)
        hidden = int(c.hidden_size)
        param = next(model.parameters(), None)
        return cls(
            layers=int(c.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(c, "head_dim", None) or hidden // heads),
            hidden=hidden,
            intermediate=int(getattr(c, "intermediate_size", None) or 4 * hidden),
            vocab=int(c.vocab_size),
            dtype_bytes=param.element_size() if param is not None else 4,
        )

    def kv_bytes(self, positions: int) -> int:
        """The KV cache of `positions` positions, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * positions * self.dtype_bytes

    def activation_bytes(self, positions: int) -> int:
        """One layer's activations over `positions` positions at a time (a forward without a graph)."""
        return positions * (4 * self.hidden + 3 * self.intermediate) * self.dtype_bytes

    def position_bytes(self) -> int:
        """What one more position in a batched forward costs: its KV cache and its activations."""
        return self.kv_bytes(1) + self.activation_bytes(1)


@functools.cache
def cpu_sdpa_keeps_weights(dtype: torch.dtype) -> bool:
    """Whether PyTorch's CPU `scaled_dot_product_attention` keeps the H x Tq x Tk attention weights for its backward
    pass, with a causal flag or with a mask (as transformers calls it): its math fallback does, its fused kernel keeps
    only a log-sum-exp per query. Told by running a small attention under saved-tensor hooks, once per dtype."""
    h, t, d = 4, 32, 16
    seen: list[int] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.numel())
        return x

    with torch.inference_mode(False), torch.enable_grad():
        q, k, v = (torch.ones(1, h, t, d, dtype=dtype).requires_grad_(True) for _ in range(3))  # no RNG draw
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return any(n >= h * t * t for n in seen)


def attention_keeps_weights(model: torch.nn.Module) -> bool:
    """Whether a backward pass through `model`'s language attention keeps the L x H x T^2 attention weights: eager
    attention does on any device; SDPA on a CPU when its kernel does (`cpu_sdpa_keeps_weights`); SDPA's fused CUDA
    kernels and flash attention keep a log-sum-exp per query instead."""
    implementation = getattr(language_config(model), "_attn_implementation", None) or "eager"
    if implementation == "eager":
        return True
    if implementation != "sdpa" or devices.input_device(model).type != "cpu":
        return False
    param = next(model.parameters(), None)
    return cpu_sdpa_keeps_weights(param.dtype if param is not None else torch.float32)


@dataclass(frozen=True)
class MemoryRequest:
    """A request as the memory estimates see it: the model's shape, N, K and where it runs.

    Attributes:
        batch_tokens, batch_rows: the positions and the most rows of one batched pass (`kv.batch_budget`); on an
            accelerator both are sized from its free memory, and the perturbation methods count the rows they will
            run (`pass_rows`). 0 rows: unknown, counted as one.
        attention_weights: whether a backward pass through attention keeps its weights (`attention_keeps_weights`).
    """

    shape: ModelShape
    n: int
    k: int
    device_type: str = "cpu"
    batch_tokens: int = 1024
    attention_weights: bool = False
    batch_rows: int = 0

    @classmethod
    def of(cls, model: torch.nn.Module, n: int, k: int, batch_tokens: int = 1024, batch_rows: int = 0) -> MemoryRequest:
        """The request of N prompt and K answer tokens on `model`, where it is.

        Raises:
            AttributeError, TypeError: a model whose shape the estimates cannot read (`ModelShape.of`).
        """
        shape = ModelShape.of(model)
        device = devices.input_device(model).type
        return cls(shape, n, k, device, batch_tokens, attention_keeps_weights(model), batch_rows)

    @property
    def t(self) -> int:
        return self.n + self.k


def pass_rows(request: MemoryRequest, batch_size: int, cpu_rows: int) -> int:
    """The most perturbed rows one batched pass of a request runs, as `kv.batch_budget` sizes them: on a CPU
    `batch_size` or `cpu_rows`; on an accelerator the rows its free memory holds (`request.batch_rows`), capped by
    `batch_size` when one is set."""
    if request.device_type == "cpu":
        return batch_size or cpu_rows
    most = max(1, request.batch_rows)
    return min(batch_size, most) if batch_size else most


def generation_bytes(request: MemoryRequest) -> int:
    """Generation with attention capture (see the module docstring)."""
    s, t = request.shape, request.t
    return s.kv_bytes(t) + s.activation_bytes(request.n) + 3 * 4 * s.layers * s.heads * t + 4 * s.vocab


def graph_bytes(request: MemoryRequest, layers: int | None = None) -> int:
    """One forward graph over T - 1 positions through `layers` (None: all) decoder layers, as the gradient methods
    keep it, and the H x T^2 attention weights of each layer where attention's backward keeps them."""
    s, t = request.shape, request.t - 1
    depth = s.layers if layers is None else min(layers, s.layers)
    per_layer = t * (10 * s.hidden + 4 * s.intermediate) * s.dtype_bytes
    if request.attention_weights:
        per_layer += s.heads * t * t * 4
    return depth * per_layer + s.kv_bytes(t) + t * s.vocab * 4


def request_bytes(request: MemoryRequest, instances: list[Any]) -> dict[str, int]:
    """Bytes per part of the request: "generation" and each method's name (only those that need any)."""
    parts = {"generation": generation_bytes(request)}
    for m in instances:
        need = int(type(m).memory(request, m.config))
        if need:
            parts[m.name] = need
    return parts


def check_fits(parts: dict[str, int], device: torch.device | str, what: str, alternative: str) -> None:
    """Refuse, before any work, a request whose parts together exceed `USABLE` x the free memory of `device`.

    Raises:
        MemoryLimitError: names the need, the limit and `alternative`.
    """
    free = available_bytes(device)
    if free is None:
        return
    need = sum(parts.values())
    limit = int(free * USABLE)
    if need <= limit:
        return
    biggest = max(parts, key=parts.get)
    detail = ", ".join(f"{name} {format_bytes(b)}" for name, b in sorted(parts.items(), key=lambda p: -p[1]))
    raise MemoryLimitError(
        f"{what} would need about {format_bytes(need)} of memory ({detail}), more than the {format_bytes(limit)} "
        f"free on {torch.device(device).type} (limit: {int(USABLE * 100)}% of what is free"
        f"{', capped by ' + BUDGET_ENV if budget_cap() is not None else ''}). Most of it is {biggest}: "
        f"{alternative}"
    )


def check_request(
    model: torch.nn.Module, instances: list[Any], n: int, k: int, batch_tokens: int, batch_rows: int = 0
) -> None:
    """Refuse an explain request (N prompt tokens, up to K answer tokens, these methods) that will not fit;
    `batch_tokens` and `batch_rows`: `kv.batch_budget`'s pass size.

    Raises:
        MemoryLimitError: see `check_fits`.
    """
    device = devices.input_device(model)
    try:
        request = MemoryRequest.of(model, n, k, batch_tokens, batch_rows)
    except (AttributeError, TypeError):  # not a transformer (no attention heads): the capture refuses it
        return
    check_fits(
        request_bytes(request, instances),
        device,
        f"This request ({n} prompt tokens, up to {k} answer tokens)",
        "shorten the prompt or the answer, or leave that method out (MACS needs the least).",
    )
