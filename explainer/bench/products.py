"""The forms the stacked product of MACS's decode step could take (`runtime.scores.stacked_scores`), timed on one
device and checked against a float64 product: which one a GPU serves best at long prompts (issue #51).

On an H200 at 32k prompt tokens (2026-12-04, docs/gpu.md) the current form, `torch.bmm(q, k^T,
out_dtype=torch.float32)` over (L x KVH) batches of G queries against T keys, ran as cuBLAS's `magma_sgemmEx_kernel`
at about a tenth of what the memory allows: 0.91 ms of MACS's 1.28 ms extra a step. The others: the same product with
its operands swapped (a tall (T, D) x (D, G) product, then transposed), the keys upcast to float32 first (all at once,
or one layer at a time as the fallback does), and the model's dtype out then upcast (for the record only: its scores
are rounded to bf16, which is not float32 arithmetic). The current form is also timed replayed from a CUDA graph, as
the step runs it. A form the device does not have (`bmm` with `out_dtype` or a graph on a CPU) is recorded with its
error.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..runtime.scores import stacked_scores

SHAPES = {  # name: (layers, key heads, queries a key head, head width): the embedded model and Llama-3.1-8B
    "SmolLM2-135M": (30, 3, 3, 64),
    "Llama-3.1-8B": (32, 8, 4, 128),
}
TOKENS = {"SmolLM2-135M": (1024, 32768), "Llama-3.1-8B": (2048, 32768)}
TINY_SHAPES, TINY_TOKENS = {"tiny": (2, 2, 2, 16)}, {"tiny": (64, 256)}


def _current(q: torch.Tensor, k: torch.Tensor, layers: int) -> torch.Tensor:  # the step's own (CUDA's)
    return stacked_scores(q, k.transpose(1, 2), len(q) // layers, float32_out=True)


def _swapped(q: torch.Tensor, k: torch.Tensor, layers: int) -> torch.Tensor:
    return torch.bmm(k, q.transpose(1, 2), out_dtype=torch.float32).transpose(1, 2).contiguous()


def _upcast(q: torch.Tensor, k: torch.Tensor, layers: int) -> torch.Tensor:
    return torch.bmm(q.float(), k.float().transpose(1, 2))


def _upcast_by_layer(q: torch.Tensor, k: torch.Tensor, layers: int) -> torch.Tensor:  # the step's elsewhere
    return stacked_scores(q, k.transpose(1, 2), len(q) // layers, float32_out=False)


def _model_dtype(q: torch.Tensor, k: torch.Tensor, layers: int) -> torch.Tensor:
    return torch.bmm(q, k.transpose(1, 2)).float()


_GRAPH: dict = {}  # the last recorded graph of `_current_replayed`: its operands' key, the graph, its output


def _current_replayed(q: torch.Tensor, k: torch.Tensor, layers: int) -> torch.Tensor:
    """The current form recorded once in a CUDA graph for these operands, then replayed, as the decode step runs it
    (on the H200 the graph step's profile gave its kernel 0.91 ms a step at 32k, the form alone 0.13 ms)."""
    if q.device.type != "cuda":
        raise RuntimeError("a CUDA graph needs a CUDA device")
    key = (q.data_ptr(), k.data_ptr(), tuple(q.shape), tuple(k.shape))
    if _GRAPH.get("key") != key:
        _GRAPH.clear()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture, as torch's graphs want
            _current(q, k, layers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _current(q, k, layers)
        _GRAPH.update(key=key, graph=graph, out=out)
    _GRAPH["graph"].replay()
    return _GRAPH["out"]


FORMS: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "bmm-out-float32 (current)": _current,
    "bmm-out-float32, replayed from a CUDA graph": _current_replayed,
    "swapped-out-float32": _swapped,
    "upcast-keys": _upcast,
    "upcast-keys-by-layer": _upcast_by_layer,
    "model-dtype-then-float (not float32 arithmetic)": _model_dtype,
}


def _milliseconds(run: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    """The median of `repeats` timed calls after two untimed ones (CUDA events on CUDA)."""
    for _ in range(2):
        run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append(1000 * (time.perf_counter() - began))
    return statistics.median(times)


def measure(shape: tuple[int, int, int, int], tokens: int, device: torch.device, dtype: torch.dtype,
            repeats: int = 20, seed: int = 0) -> list[dict]:  # fmt: skip
    """Every form of one step's product at `tokens` keys: its median time and its largest gap from the float64
    product relative to that product's largest magnitude (None with the error where the device lacks the form)."""
    layers, kvh, g, d = shape
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where they are used (GBs of keys at 32k)
    q = torch.randn(layers * kvh, g, d, generator=gen, device=device).to(dtype)
    k = torch.randn(layers * kvh, tokens, d, generator=gen, device=device).to(dtype)
    want = torch.bmm(q.double(), k.double().transpose(1, 2))
    scale = want.abs().max().item()
    rows = []
    for name, form in FORMS.items():
        row = {"form": name, "tokens": tokens, "ms": None, "relative_error": None, "error": None}
        try:
            got = form(q, k, layers)
            row["relative_error"] = (got.double() - want).abs().max().item() / scale
            row["ms"] = _milliseconds(lambda f=form: f(q, k, layers), device, repeats)
        except (RuntimeError, NotImplementedError) as e:  # the device lacks this form
            row["error"] = str(e).splitlines()[0][:200]
        rows.append(row)
    return rows
